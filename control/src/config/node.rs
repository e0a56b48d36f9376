//! Walking parsed YAML with the path of every value, so that each problem
//! is reported as `file: path: reason`, and all of them at once.

use std::fmt;
use std::str::FromStr;

use serde_yaml::Value;

/// One problem found in a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file.
    pub file: String,
    /// Where in it (`routes[0].vips[1]`).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.message)
        }
    }
}

/// Collects problems while walking.
#[derive(Debug, Default)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// Adds one.
    pub fn add(&mut self, file: &str, path: &str, message: impl Into<String>) {
        self.0.push(Problem { file: file.to_owned(), path: path.to_owned(), message: message.into() });
    }

    /// True when none were found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A YAML value with its file and path.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// The value.
    pub v: &'a Value,
    file: &'a str,
    path: &'a str,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

impl<'a> Node<'a> {
    /// The document root.
    pub fn root(v: &'a Value, file: &'a str) -> Node<'a> {
        Node { v, file, path: "" }
    }

    /// A value whose path starts with `path`.
    pub fn at(v: &'a Value, file: &'a str, path: &'a str) -> Node<'a> {
        Node { v, file, path }
    }

    /// Its path.
    pub fn path(&self) -> &str {
        self.path
    }

    /// Its file.
    pub fn file(&self) -> &'a str {
        self.file
    }

    /// Reports a problem at this node.
    pub fn bad(&self, p: &mut Problems, message: impl Into<String>) {
        p.add(self.file, self.path, message);
    }

    fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Calls `f` with the field `key` when present (and not null).
    pub fn field<R>(&self, key: &str, f: impl FnOnce(Node<'_>) -> R) -> Option<R> {
        let v = self.v.as_mapping()?.get(key)?;
        if v.is_null() {
            return None;
        }
        let path = self.child_path(key);
        Some(f(Node { v, file: self.file, path: &path }))
    }

    /// Like [`Node::field`], reporting the field as missing when absent.
    pub fn required<R>(&self, p: &mut Problems, key: &str, f: impl FnOnce(Node<'_>, &mut Problems) -> R) -> Option<R> {
        let present = self.v.as_mapping().and_then(|m| m.get(key)).is_some_and(|v| !v.is_null());
        if !present {
            self.bad(p, format!("missing field {key:?}"));
            return None;
        }
        self.field(key, |n| f(n, p))
    }

    /// Checks that it is a mapping whose keys are all in `known`.
    pub fn mapping(&self, p: &mut Problems, known: &[&str]) -> bool {
        let Some(m) = self.v.as_mapping() else {
            self.bad(p, format!("expected a mapping, found {}", kind(self.v)));
            return false;
        };
        for k in m.keys() {
            match k.as_str() {
                Some(k) if known.contains(&k) => {}
                Some(k) => {
                    let mut close: Vec<&&str> = known.iter().filter(|c| similar(c, k)).collect();
                    close.truncate(1);
                    let hint = match close.first() {
                        Some(c) => format!(" (did you mean {c:?}?)"),
                        None => format!(" (known: {})", known.join(", ")),
                    };
                    p.add(self.file, &self.child_path(k), format!("unknown field{hint}"));
                }
                None => self.bad(p, "keys must be strings"),
            }
        }
        true
    }

    /// Calls `f` for each element of a list (a single value counts as a
    /// list of one).
    pub fn each(&self, p: &mut Problems, mut f: impl FnMut(Node<'_>, &mut Problems)) {
        match self.v {
            Value::Sequence(items) => {
                for (i, v) in items.iter().enumerate() {
                    let path = format!("{}[{i}]", self.path);
                    f(Node { v, file: self.file, path: &path }, p);
                }
            }
            _ => f(*self, p),
        }
    }

    /// A string (numbers are taken as their text).
    pub fn string(&self, p: &mut Problems) -> Option<String> {
        match self.v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            other => {
                self.bad(p, format!("expected a string, found {}", kind(other)));
                None
            }
        }
    }

    /// A boolean.
    pub fn boolean(&self, p: &mut Problems) -> Option<bool> {
        match self.v {
            Value::Bool(b) => Some(*b),
            Value::String(s) if s == "true" || s == "false" => Some(s == "true"),
            other => {
                self.bad(p, format!("expected true or false, found {}", kind(other)));
                None
            }
        }
    }

    /// An integer within `lo..=hi`.
    pub fn int(&self, p: &mut Problems, lo: i64, hi: i64) -> Option<i64> {
        let n = match self.v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        match n {
            Some(n) if (lo..=hi).contains(&n) => Some(n),
            Some(n) => {
                self.bad(p, format!("{n} is out of range {lo}..={hi}"));
                None
            }
            None => {
                self.bad(p, format!("expected a whole number, found {}", kind(self.v)));
                None
            }
        }
    }

    /// A value parsed from its string form, with `what` naming the
    /// expected kind in the error.
    pub fn parse<T: FromStr>(&self, p: &mut Problems, what: &str) -> Option<T>
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

    #[test]
    fn paths_and_typos() {
        let v: Value = serde_yaml::from_str("a: {b: [1, x], prioity: 3}").unwrap();
        let root = Node::root(&v, "f.yaml");
        let mut p = Problems::default();
        root.field("a", |a| {
            a.mapping(&mut p, &["b", "priority"]);
            a.field("b", |b| b.each(&mut p, |n, p| {
                n.int(p, 0, 10);
            }));
        });
        let msgs: Vec<String> = p.0.iter().map(ToString::to_string).collect();
        assert_eq!(msgs, vec![
            "f.yaml: a.prioity: unknown field (did you mean \"priority\"?)".to_string(),
            "f.yaml: a.b[1]: expected a whole number, found a string".to_string(),
        ]);
    }
}
