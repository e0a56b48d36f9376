//! House rules that a test can check: the keyword that allows raw-pointer
//! code appears only in `ffi/`, the workspace's crates depend on each other
//! downwards only, and the control side's modules import only layers below
//! their own (ARCHITECTURE.md's order), with no cycle; the controller and
//! what it shares with the appliance do not depend on DPDK's bindings; the
//! control side's crates deny `unreachable_pub`.
//!
//! The crates come from the workspace's members (`cargo metadata`), so a
//! new crate is checked without editing this file; a crate or a control-side
//! module that [`CRATES`] or [`LAYERS`] does not place fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The workspace's crates, bottom first: a crate may depend only on crates
/// before it. A member not listed here fails the test. (`ffi` implements
/// the data plane's packet I/O trait over DPDK's queues, so it stands above
/// the pure-Rust data plane; the benchmarks reuse the tests' helpers. The
/// admin API's types depend on none of ours: the server and `sluice status`
/// both use them. The lab tools' generator stands on the data plane and its
/// DPDK queues. `sluice-core` holds the layers the appliance and the
/// controller share; the controller stands on it alone.)
const CRATES: &[&str] = &[
    "sluice-admin-api",
    "sluice-dataplane",
    "sluice-ffi",
    "sluice-lab",
    "sluice-core",
    "sluice-controller",
    "sluice",
    "sluice-tests",
    "sluice-bench",
];

/// The one crate allowed the keyword that permits raw-pointer code.
const UNSAFE_CRATE: &str = "sluice-ffi";

/// The crates that must not depend on DPDK's bindings, even indirectly:
/// the controller runs in a pod without DPDK, and what it shares with the
/// appliance sits below both.
const WITHOUT_DPDK: &[&str] = &["sluice-core", "sluice-controller"];

/// The crates whose `pub` is a decision: an item is `pub` only when another
/// crate uses it, and every root denies `unreachable_pub`, so a `pub` item
/// in a private module does not compile.
const PUB_DECIDED: &[&str] = &["sluice-admin-api", "sluice-lab", "sluice-core", "sluice-controller", "sluice"];

/// The control side's crates and their layers, bottom first
/// (ARCHITECTURE.md): a module may import its own top-level module and
/// those of lower layers, never a higher one. Each layer names top-level
/// modules of its crate; `main` stands for the binary's own modules. A
/// top-level module not listed fails. A crate's layers all stand above
/// those of the crates it depends on (checked by [`CRATES`]).
///
/// In `sluice-core`, the model stands below config: the file's
/// `services:`/`routes:` and the manifests parse into the model's object
/// definitions (the ones xDS and Kubernetes produce too), and the model
/// imports nothing but the ground. The custom resources' types are a schema
/// beside the config's. In the controller, the decisions (identifiers,
/// slices, Deployments) stand below what runs them (a directory or an API
/// server).
const LAYERS: &[(&str, Layers)] = &[
    (
        "sluice-core",
        &[("ground", &["ground", "problem", "logging"]), ("model", &["model"]), ("config", &["config", "crd"])],
    ),
    (
        "sluice",
        &[
            ("compile", &["compile"]),
            ("sources", &["sources"]),
            ("reconcile", &["reconcile"]),
            ("routing", &["routing", "sync", "health"]),
            ("admin", &["admin"]),
            ("products", &["appliance"]),
            ("cli", &["cli"]),
            ("binaries", &["main"]),
        ],
    ),
    (
        "sluice-controller",
        &[
            ("identifiers", &["ids"]),
            ("decisions", &["slices", "gateway"]),
            ("lease", &["lease"]),
            ("runs", &["dryrun", "client"]),
            ("cli", &["cli"]),
            ("binaries", &["main"]),
        ],
    ),
];

// ---------------------------------------------------------------------------
// The workspace.

#[derive(Debug)]
struct Member {
    name: String,
    dir: PathBuf,
    /// Crate roots: the library's and each binary's source file.
    roots: Vec<(String, PathBuf)>,
    /// Other workspace members it depends on (any kind of dependency).
    deps: BTreeSet<String>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The members of the workspace whose manifest is `manifest`.
fn members(manifest: &Path) -> Vec<Member> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--no-deps", "--offline", "--format-version", "1", "--manifest-path"])
        .arg(manifest)
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: BTreeSet<&str> =
        meta["workspace_members"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let packages = meta["packages"].as_array().unwrap();
    let names: BTreeSet<String> = packages
        .iter()
        .filter(|p| ids.contains(p["id"].as_str().unwrap()))
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .filter(|p| ids.contains(p["id"].as_str().unwrap()))
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            let roots = p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| {
                    t["kind"].as_array().unwrap().iter().any(|k| matches!(k.as_str(), Some("lib" | "bin")))
                })
                .map(|t| (t["kind"][0].as_str().unwrap().to_string(), PathBuf::from(t["src_path"].as_str().unwrap())))
                .collect();
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["path"].is_string())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|n| names.contains(n) && n != p["name"].as_str().unwrap())
                .collect();
            Member {
                name: p["name"].as_str().unwrap().to_string(),
                dir: manifest.parent().unwrap().to_path_buf(),
                roots,
                deps,
            }
        })
        .collect()
}

/// Every workspace in the repository: the root one and any other whose
/// manifest declares its own `[workspace]` (built on its own, as the fuzz
/// targets are).
fn all_members() -> Vec<Member> {
    let root = repo_root();
    let mut manifests = vec![root.join("Cargo.toml")];
    let mut files = Vec::new();
    walk(&root, &mut files, "Cargo.toml");
    for m in files {
        if m != root.join("Cargo.toml")
            && std::fs::read_to_string(&m).unwrap().lines().any(|l| l.trim() == "[workspace]")
        {
            manifests.push(m);
        }
    }
    manifests.iter().flat_map(|m| members(m)).collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>, suffix: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(&p, out, suffix);
            }
        } else if name.ends_with(suffix) {
            out.push(p);
        }
    }
}

#[test]
fn unsafe_lives_only_in_ffi() {
    let members = all_members();
    assert!(members.iter().any(|m| m.name == UNSAFE_CRATE), "{UNSAFE_CRATE} is a member");
    let mut files = Vec::new();
    for m in members.iter().filter(|m| m.name != UNSAFE_CRATE) {
        walk(&m.dir, &mut files, ".rs");
    }
    assert!(files.len() > 3, "found the sources");
    let word = ["un", "safe"].concat();
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines().any(|l| {
                let code = l.split("//").next().unwrap_or("");
                code.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == word)
            })
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "`{word}` outside ffi/: {offenders:?}");
}

#[test]
fn crates_depend_downwards() {
    let members = members(&repo_root().join("Cargo.toml"));
    let mut problems = Vec::new();
    for m in &members {
        let Some(at) = CRATES.iter().position(|c| *c == m.name) else {
            problems.push(format!("crate {} is not placed in CRATES", m.name));
            continue;
        };
        for d in &m.deps {
            match CRATES.iter().position(|c| c == d) {
                Some(below) if below < at => {}
                _ => problems.push(format!("crate {} depends on {d}, which is not below it", m.name)),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_controller_side_stands_without_dpdk() {
    let members = members(&repo_root().join("Cargo.toml"));
    let deps: BTreeMap<&str, &BTreeSet<String>> = members.iter().map(|m| (m.name.as_str(), &m.deps)).collect();
    for krate in WITHOUT_DPDK {
        assert!(deps.contains_key(krate), "{krate} is a member");
        // Every workspace crate it depends on, directly or not.
        let mut seen = BTreeSet::new();
        let mut todo = vec![krate.to_string()];
        while let Some(c) = todo.pop() {
            for d in deps.get(c.as_str()).into_iter().flat_map(|d| d.iter()) {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        assert!(!seen.contains(UNSAFE_CRATE), "{krate} depends on {UNSAFE_CRATE} (through {seen:?})");
    }
}

#[test]
fn control_side_roots_deny_unreachable_pub() {
    let members = members(&repo_root().join("Cargo.toml"));
    let mut problems = Vec::new();
    for krate in PUB_DECIDED {
        let m = members.iter().find(|m| m.name == *krate).unwrap_or_else(|| panic!("{krate} is a member"));
        assert!(!m.roots.is_empty(), "{krate} has a root");
        for (_, root) in &m.roots {
            let file = syn::parse_file(&std::fs::read_to_string(root).unwrap()).unwrap();
            let denied = file.attrs.iter().any(|a| {
                a.path().is_ident("deny")
                    && a.parse_args_with(syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated)
                        .is_ok_and(|lints| lints.iter().any(|l| l.is_ident("unreachable_pub")))
            });
            if !denied {
                problems.push(format!("{} does not deny unreachable_pub", root.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// A crate's modules and the paths between them.

/// A module's path from the crate root, `["sources", "xds", "client"]`.
type ModPath = Vec<String>;

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if {
                let t = l.tokens.to_string();
                t.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == "test") && !t.contains("not")
            })
    })
}

/// Finds every module of a crate from its root file, following `mod`
/// declarations (test-only modules left out: tests may wire layers
/// together). Returns each module's path and its file.
fn modules(root: &Path, prefix: &ModPath, out: &mut BTreeMap<ModPath, PathBuf>) {
    let text = std::fs::read_to_string(root).unwrap();
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    out.insert(prefix.clone(), root.to_path_buf());
    // A file `a/b.rs` keeps its children in `a/b/`; `mod.rs`, `lib.rs` and
    // `main.rs` in their own folder.
    let stem = root.file_stem().unwrap().to_string_lossy().into_owned();
    let dir = if prefix.is_empty() || stem == "mod" {
        root.parent().unwrap().to_path_buf()
    } else {
        root.parent().unwrap().join(&stem)
    };
    declared(&file.items, &dir, prefix, out);
}

fn declared(items: &[syn::Item], dir: &Path, prefix: &ModPath, out: &mut BTreeMap<ModPath, PathBuf>) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if is_cfg_test(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let mut path = prefix.clone();
        path.push(name.clone());
        match &m.content {
            Some((_, inner)) => declared(inner, &dir.join(&name), &path, out),
            None => {
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(&name).join("mod.rs");
                let file = if flat.is_file() { flat } else { nested };
                assert!(file.is_file(), "module {} has no file in {}", path.join("::"), dir.display());
                modules(&file, &path, out);
            }
        }
    }
}

/// Collects the modules a file's paths name: every `use` and every path
/// that starts with `crate`, `self`, `super`, a child module's name or (in
/// a binary) the library's name.
struct Refs<'a> {
    known: &'a BTreeSet<ModPath>,
    /// The module being read (an inline module extends it).
    here: ModPath,
    /// The library's crate name, as a binary of the same package spells it.
    lib: Option<&'a str>,
    found: BTreeSet<ModPath>,
}

impl Refs<'_> {
    fn resolve(&mut self, segs: &[String]) {
        let Some(first) = segs.first() else { return };
        let (mut base, rest): (ModPath, &[String]) = match first.as_str() {
            "crate" => (Vec::new(), &segs[1..]),
            "self" => (self.here.clone(), &segs[1..]),
            "super" => {
                let mut base = self.here.clone();
                let mut i = 0;
                while segs.get(i).map(String::as_str) == Some("super") {
                    base.pop();
                    i += 1;
                }
                (base, &segs[i..])
            }
            name if Some(name) == self.lib => (vec![LIB_MARK.to_string()], &segs[1..]),
            name => {
                let mut child = self.here.clone();
                child.push(name.to_string());
                if !self.known.contains(&child) {
                    return;
                }
                (self.here.clone(), segs)
            }
        };
        // The longest prefix that is a module is the one referred to.
        let mut target = base.clone();
        for s in rest {
            base.push(s.clone());
            if self.known.contains(&base) {
                target = base.clone();
            } else {
                break;
            }
        }
        self.found.insert(target);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.resolve(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

/// Marks a path into the library from one of the package's binaries.
const LIB_MARK: &str = "<lib>";

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_cfg_test(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // An out-of-line module is read from its own file.
        if let Some((_, items)) = &m.content {
            self.here.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.here.pop();
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item {
            if is_cfg_test(&f.attrs) {
                return;
            }
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() > 1 {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.resolve(&segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// One import between two modules of the layered crate.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
}

/// A layered crate's module graph: its modules, keyed `a::b`, with `main`
/// standing for the binary's modules, and the imports between modules of
/// different top-level modules (paths into other crates are the crates'
/// order's business).
fn module_graph(members: &[Member], crate_name: &str) -> (BTreeSet<String>, BTreeSet<Edge>) {
    let krate = members.iter().find(|m| m.name == crate_name).unwrap_or_else(|| panic!("{crate_name} is a member"));
    let lib_name = crate_name.replace('-', "_");
    let mut names = BTreeSet::new();
    let mut edges = BTreeSet::new();
    for (kind, root) in &krate.roots {
        let mut mods = BTreeMap::new();
        modules(root, &Vec::new(), &mut mods);
        let known: BTreeSet<ModPath> = mods.keys().cloned().collect();
        let is_bin = kind == "bin";
        let name_of = |p: &ModPath| -> String {
            if is_bin {
                std::iter::once("main".to_string()).chain(p.iter().cloned()).collect::<Vec<_>>().join("::")
            } else {
                p.join("::")
            }
        };
        for (path, file) in &mods {
            if !path.is_empty() || is_bin {
                names.insert(name_of(path));
            }
            let text = std::fs::read_to_string(file).unwrap();
            let ast = syn::parse_file(&text).unwrap();
            let mut refs = Refs {
                known: &known,
                here: path.clone(),
                lib: if is_bin { Some(&lib_name) } else { None },
                found: BTreeSet::new(),
            };
            for item in &ast.items {
                refs.visit_item(item);
            }
            let from = name_of(path);
            for target in refs.found {
                let to = if target.first().map(String::as_str) == Some(LIB_MARK) {
                    target[1..].join("::")
                } else {
                    name_of(&target)
                };
                // The crate root only declares modules; an import of it is
                // an import of nothing in particular.
                if to.is_empty() || unit(&to) == unit(&from) {
                    continue;
                }
                edges.insert(Edge { from: from.clone(), to });
            }
        }
    }
    (names, edges)
}

/// The top-level module a module belongs to.
fn unit(module: &str) -> &str {
    module.split("::").next().unwrap()
}

/// The crate's layers, as [`LAYERS`] places them.
type Layers = &'static [(&'static str, &'static [&'static str])];

fn layer_of(layers: Layers, module: &str) -> Option<usize> {
    layers.iter().position(|(_, units)| units.contains(&unit(module)))
}

/// Every simple cycle among top-level modules, each listed from its
/// smallest member, found by depth-first search (the graph is small).
fn cycles(edges: &BTreeSet<Edge>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges {
        next.entry(unit(&e.from)).or_default().insert(unit(&e.to));
    }
    let nodes: Vec<&str> = next.keys().copied().collect();
    let mut found = Vec::new();
    for &start in &nodes {
        let mut stack = vec![start];
        search(start, &next, &mut stack, &mut found);
    }
    found
}

fn search<'a>(
    start: &'a str,
    next: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    stack: &mut Vec<&'a str>,
    found: &mut Vec<Vec<String>>,
) {
    let at = *stack.last().unwrap();
    for &n in next.get(at).into_iter().flatten() {
        if n == start {
            found.push(stack.iter().map(|s| s.to_string()).collect());
        } else if n > start && !stack.contains(&n) && found.len() < 1000 {
            stack.push(n);
            search(start, next, stack, found);
            stack.pop();
        }
    }
}

#[test]
fn control_layers_point_down() {
    let members = members(&repo_root().join("Cargo.toml"));
    let mut problems = Vec::new();
    for (crate_name, layers) in LAYERS {
        problems.extend(layer_problems(&members, crate_name, layers));
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

/// What breaks the layering of one crate: modules [`LAYERS`] does not
/// place, upward imports and cycles among top-level modules.
fn layer_problems(members: &[Member], crate_name: &str, layers: Layers) -> Vec<String> {
    let (names, edges) = module_graph(members, crate_name);
    assert!(names.len() > 5, "found the modules of {crate_name}: {names:?}");
    let mut problems = Vec::new();
    let unplaced: BTreeSet<&str> = names.iter().map(|n| unit(n)).filter(|u| layer_of(layers, u).is_none()).collect();
    for u in &unplaced {
        problems.push(format!("module {u} of {crate_name} is not placed in LAYERS"));
    }
    let upward: BTreeSet<&Edge> = edges
        .iter()
        .filter(|e| match (layer_of(layers, &e.from), layer_of(layers, &e.to)) {
            (Some(from), Some(to)) => to > from,
            _ => false,
        })
        .collect();
    for e in &upward {
        problems.push(format!(
            "upward import in {crate_name}: {} ({}) -> {} ({})",
            e.from,
            layers[layer_of(layers, &e.from).unwrap()].0,
            e.to,
            layers[layer_of(layers, &e.to).unwrap()].0
        ));
    }
    for c in cycles(&edges) {
        problems.push(format!("cycle in {crate_name}: {} -> {}", c.join(" -> "), c[0]));
    }
    println!("{crate_name}: {} modules, {} imports across top-level modules", names.len(), edges.len());
    problems
}
