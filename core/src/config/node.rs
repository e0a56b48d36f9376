//! Walking parsed YAML with the path and position of every value, so that
//! each problem is reported as `file:line:column: path: reason`, and all of
//! them at once.

use std::fmt;
use std::str::FromStr;

use super::schema::{self, Kind, Table};
use super::yaml::{Data, Value};
use crate::problem::{Pos, Problems};

/// Where a node's keys are declared: the table, the path in it of the node
/// the schema was attached to, and how much of the node's own path that
/// node's path takes (the rest maps into the table).
#[derive(Clone, Copy, Debug)]
struct Schema {
    table: &'static Table,
    root: &'static str,
    skip: usize,
}

/// A YAML value with its file and path.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<'a> {
    /// The value.
    pub(crate) v: &'a Value,
    file: &'a str,
    path: &'a str,
    schema: Option<Schema>,
}

impl<'a> Node<'a> {
    /// The document root.
    pub(crate) fn root(v: &'a Value, file: &'a str) -> Node<'a> {
        Node { v, file, path: "", schema: None }
    }

    /// The root of a configuration file: its keys are those of
    /// [`schema::FILE`].
    pub(crate) fn config_root(v: &'a Value, file: &'a str) -> Node<'a> {
        Node::root(v, file).with_schema(&schema::FILE, "")
    }

    /// A value whose path starts with `path`.
    pub(crate) fn at(v: &'a Value, file: &'a str, path: &'a str) -> Node<'a> {
        Node { v, file, path, schema: None }
    }

    /// The same value, read as the mapping at `root` of `table` (a
    /// manifest's spec as a file's `routes[]`, an annotation as the
    /// annotations' key): [`Node::section`] and [`Node::bounded`] take its
    /// keys and bounds from there.
    pub(crate) fn with_schema(self, table: &'static Table, root: &'static str) -> Node<'a> {
        Node { schema: Some(Schema { table, root, skip: self.path.len() }), ..self }
    }

    /// Its path in its schema's table, without indices.
    fn schema_path(&self) -> Option<(&'static Table, String)> {
        let s = self.schema?;
        let rest = schema::normalize(self.path.get(s.skip..).unwrap_or(""));
        let rest = rest.trim_start_matches('.');
        let path = match (s.root.is_empty(), rest.is_empty()) {
            (_, true) => s.root.to_owned(),
            (true, false) => rest.to_owned(),
            (false, false) => format!("{}.{rest}", s.root),
        };
        Some((s.table, path))
    }

    /// Its path.
    pub(crate) fn path(&self) -> &str {
        self.path
    }

    /// Its file.
    pub(crate) fn file(&self) -> &'a str {
        self.file
    }

    /// Where it starts, when it was read from text (an object from the
    /// Kubernetes API has no position).
    pub(crate) fn pos(&self) -> Option<Pos> {
        self.v.at()
    }

    /// Reports a problem at this node.
    pub(crate) fn bad(&self, p: &mut Problems, message: impl Into<String>) {
        p.add(self.file, self.v.at(), self.path, message);
    }

    fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Calls `f` with the field `key` when present (and not null).
    pub(crate) fn field<R>(&self, key: &str, f: impl FnOnce(Node<'_>) -> R) -> Option<R> {
        let v = self.v.get(key)?;
        if v.is_null() {
            return None;
        }
        let path = self.child_path(key);
        Some(f(Node { v, file: self.file, path: &path, schema: self.schema }))
    }

    /// Like [`Node::field`], reporting the field as missing (at this
    /// mapping) when absent.
    pub(crate) fn required<R>(&self, p: &mut Problems, key: &str, f: impl FnOnce(Node<'_>, &mut Problems) -> R) -> Option<R> {
        if self.v.get(key).is_none_or(Value::is_null) {
            self.bad(p, format!("missing field {key:?}"));
            return None;
        }
        self.field(key, |n| f(n, p))
    }

    /// Checks that it is a mapping whose keys are all in `known`.
    pub(crate) fn mapping(&self, p: &mut Problems, known: &[&str]) -> bool {
        let Some(m) = self.v.as_map() else {
            self.bad(p, format!("expected a mapping, found {}", self.v.kind()));
            return false;
        };
        for (k, _) in m {
            match k.as_str() {
                Some(k) if known.contains(&k) => {}
                Some(name) => {
                    let mut close: Vec<&&str> = known.iter().filter(|c| similar(c, name)).collect();
                    close.truncate(1);
                    let hint = match close.first() {
                        Some(c) => format!(" (did you mean {c:?}?)"),
                        None => format!(" (known: {})", known.join(", ")),
                    };
                    p.add(self.file, k.at(), &self.child_path(name), format!("unknown field{hint}"));
                }
                None => p.add(self.file, k.at(), self.path, "keys must be strings"),
            }
        }
        true
    }

    /// Checks that it is a mapping of the keys its schema declares at its
    /// path, refusing those declared removed with what replaced them.
    pub(crate) fn section(&self, p: &mut Problems) -> bool {
        let Some((table, path)) = self.schema_path() else {
            self.bad(p, "no keys are declared here (a fault of the parser: please report it)");
            return false;
        };
        if !self.mapping(p, table.children(&path)) {
            return false;
        }
        for name in table.children(&path) {
            let Some(key) = table.get(&if path.is_empty() { (*name).to_owned() } else { format!("{path}.{name}") }) else { continue };
            if let Kind::Removed(by) = key.kind {
                self.field(name, |n| n.bad(p, format!("replaced by {by}")));
            }
        }
        true
    }

    /// A whole number within the bounds its schema declares at its path.
    pub(crate) fn bounded(&self, p: &mut Problems) -> Option<i64> {
        match self.schema_path().and_then(|(t, path)| t.get(&path)).map(|k| k.kind) {
            Some(Kind::Int(lo, hi)) => self.int(p, lo, hi),
            _ => {
                self.bad(p, "no bounds are declared here (a fault of the parser: please report it)");
                None
            }
        }
    }

    /// The bounds, in milliseconds, its schema declares for a duration at
    /// its path.
    pub(crate) fn duration_bounds(&self) -> Option<(u64, u64)> {
        match self.schema_path().and_then(|(t, path)| t.get(&path)).map(|k| k.kind) {
            Some(Kind::Duration(lo, hi)) => Some((lo, hi)),
            _ => None,
        }
    }

    /// Calls `f` for each element of a list (a single value counts as a
    /// list of one).
    pub(crate) fn each(&self, p: &mut Problems, mut f: impl FnMut(Node<'_>, &mut Problems)) {
        match self.v.data() {
            Data::Seq(items) => {
                for (i, v) in items.iter().enumerate() {
                    let path = format!("{}[{i}]", self.path);
                    f(Node { v, file: self.file, path: &path, schema: self.schema }, p);
                }
            }
            _ => f(*self, p),
        }
    }

    /// A string (numbers are taken as their text).
    pub(crate) fn string(&self, p: &mut Problems) -> Option<String> {
        match self.v.data() {
            Data::Str(s) | Data::Number(s) => Some(s.clone()),
            Data::Int(n) => Some(n.to_string()),
            _ => {
                self.bad(p, format!("expected a string, found {}", self.v.kind()));
                None
            }
        }
    }

    /// A boolean.
    pub(crate) fn boolean(&self, p: &mut Problems) -> Option<bool> {
        match self.v.data() {
            Data::Bool(b) => Some(*b),
            Data::Str(s) if s == "true" || s == "false" => Some(s == "true"),
            Data::Str(s) => {
                self.bad(p, format!("{s:?} is not true or false"));
                None
            }
            _ => {
                self.bad(p, format!("expected true or false, found {}", self.v.kind()));
                None
            }
        }
    }

    /// An integer within `lo..=hi`; strings of digits count (annotations
    /// are strings).
    pub(crate) fn int(&self, p: &mut Problems, lo: i64, hi: i64) -> Option<i64> {
        let text = match self.v.data() {
            Data::Int(n) => n.to_string(),
            Data::Number(s) | Data::Str(s) => s.trim().to_owned(),
            _ => {
                self.bad(p, format!("expected a whole number, found {}", self.v.kind()));
                return None;
            }
        };
        let digits = text.strip_prefix(['-', '+']).unwrap_or(&text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            self.bad(p, format!("{text:?} is not a whole number"));
            return None;
        }
        match text.parse::<i64>() {
            Ok(n) if (lo..=hi).contains(&n) => Some(n),
            _ => {
                self.bad(p, format!("{text} is out of range {lo}..={hi}"));
                None
            }
        }
    }

    /// A value parsed from its string form, with `what` naming the
    /// expected kind in the error.
    pub(crate) fn parse<T: FromStr>(&self, p: &mut Problems, what: &str) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        let s = self.string(p)?;
        match s.trim().parse::<T>() {
            Ok(v) => Some(v),
            Err(e) => {
                self.bad(p, format!("{s:?} is not {what}: {e}"));
                None
            }
        }
    }
}

/// Close enough to be a likely typo (case-insensitive, or one edit apart).
fn similar(a: &str, b: &str) -> bool {
    if a.eq_ignore_ascii_case(b) {
        return true;
    }
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().abs_diff(b.len()) > 1 {
        return false;
    }
    // Levenshtein distance <= 1.
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()] <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::yaml::{document, Budget};

    #[test]
    fn paths_positions_and_typos() {
        let v = document("a: {b: [1, x], prioity: 3}\nc:\n  d: 1\n", &mut Budget::default()).unwrap();
        let root = Node::root(&v, "f.yaml");
        let mut p = Problems::default();
        root.field("a", |a| {
            a.mapping(&mut p, &["b", "priority"]);
            a.field("b", |b| b.each(&mut p, |n, p| {
                n.int(p, 0, 10);
            }));
        });
        root.field("c", |c| c.required(&mut p, "e", |_, _| ()));
        let msgs: Vec<String> = p.0.iter().map(ToString::to_string).collect();
        assert_eq!(msgs, vec![
            "f.yaml:1:16: a.prioity: unknown field (did you mean \"priority\"?)".to_string(),
            "f.yaml:1:12: a.b[1]: \"x\" is not a whole number".to_string(),
            "f.yaml:3:3: c: missing field \"e\"".to_string(),
        ]);
    }

    #[test]
    fn numbers_out_of_range() {
        let v = document("[\"4294967291\", 99999999999999999999, 7, 1.5, -1]", &mut Budget::default()).unwrap();
        let mut p = Problems::default();
        let mut got = Vec::new();
        Node::root(&v, "f").each(&mut p, |n, p| got.extend(n.int(p, 0, 10)));
        assert_eq!(got, vec![7]);
        let msgs: Vec<&str> = p.0.iter().map(|x| x.message.as_str()).collect();
        assert_eq!(msgs, vec![
            "4294967291 is out of range 0..=10",
            "99999999999999999999 is out of range 0..=10",
            "\"1.5\" is not a whole number",
            "-1 is out of range 0..=10",
        ]);
    }
}
