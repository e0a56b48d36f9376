//! Problems found in what a user or a control plane wrote: each with its
//! file, position, path and reason, printed `file:line:column: path:
//! reason`. Every source, the model and the compiler report in these terms.

use std::fmt;

/// A place in a file: line and column, both from 1 (columns count
/// characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Pos {
    /// Line.
    pub line: u32,
    /// Column.
    pub column: u32,
}

/// One problem found in a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file.
    pub file: String,
    /// Where in the file the value it is about starts (for a missing
    /// field: the mapping that lacks it); `None` when it is about the whole
    /// file (unreadable, too large) or comes from no file.
    pub pos: Option<Pos>,
    /// Where in the document (`routes[0].vips[1]`); may be empty.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    /// A problem with no position.
    pub fn new(file: impl Into<String>, path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { file: file.into(), pos: None, path: path.into(), message: message.into() }
    }

    /// A problem at `pos`.
    pub(crate) fn at(file: impl Into<String>, pos: Option<Pos>, path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { file: file.into(), pos, path: path.into(), message: message.into() }
    }
}

/// `file:line:column: path: reason`, leaving out what is not known
/// (`file: path: reason`, `file:line:column: reason`, `file: reason`).
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(p) = self.pos {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Most problems listed; past it one more says that there are more.
pub(crate) const MAX_PROBLEMS: usize = 1000;

/// Collects problems while walking.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub Vec<Problem>);

impl Problems {
    /// Adds one (past [`MAX_PROBLEMS`], only a note that there are more).
    pub(crate) fn push(&mut self, problem: Problem) {
        match self.0.len() {
            n if n < MAX_PROBLEMS => self.0.push(problem),
            MAX_PROBLEMS => self.0.push(Problem::new(
                problem.file,
                "",
                format!("more problems, not listed: only the first {MAX_PROBLEMS} are"),
            )),
            _ => {}
        }
    }

    /// Adds one made of its parts.
    pub(crate) fn add(&mut self, file: &str, pos: Option<Pos>, path: &str, message: impl Into<String>) {
        self.push(Problem::at(file, pos, path, message));
    }

    /// True when none were found.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_leaves_out_what_is_unknown() {
        let at = Some(Pos { line: 3, column: 7 });
        assert_eq!(Problem::at("f", at, "a.b", "bad").to_string(), "f:3:7: a.b: bad");
        assert_eq!(Problem::at("f", at, "", "bad").to_string(), "f:3:7: bad");
        assert_eq!(Problem::new("f", "a.b", "bad").to_string(), "f: a.b: bad");
        assert_eq!(Problem::new("f", "", "bad").to_string(), "f: bad");
    }

    #[test]
    fn too_many_problems_are_cut_short() {
        let mut p = Problems::default();
        for _ in 0..MAX_PROBLEMS + 5 {
            p.add("f", None, "", "x");
        }
        assert_eq!(p.0.len(), MAX_PROBLEMS + 1);
        assert!(p.0[MAX_PROBLEMS].message.starts_with("more problems"));
    }
}
