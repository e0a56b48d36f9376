//! YAML read into values that know their line and column, with limits that
//! hold while reading, so that hostile input is refused early and cheaply.
//!
//! The events of `saphyr-parser` are assembled here rather than by a
//! library loader, because the limits must apply as the tree grows:
//! - a file is at most [`MAX_FILE_BYTES`] (checked before and while reading);
//! - lists and mappings nest at most [`MAX_DEPTH`] deep (aliases included);
//! - one load holds at most [`MAX_VALUES`] values, counting what aliases
//!   expand to, and aliases expand to at most [`MAX_ALIAS_VALUES`] values:
//!   a "billion laughs" document stops at the alias that crosses the limit,
//!   long before anything is expanded (values are shared, never copied);
//! - one load holds at most [`MAX_DOCUMENTS`] documents;
//! - a mapping has each key once.
//!
//! Scalars follow the YAML 1.2 core schema: `null`/`~`/empty, `true`/`false`,
//! integers (decimal, `0x`, `0o`), floats; quoted and block scalars are
//! strings.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::rc::Rc;

use saphyr_parser::{Event, Marker, Parser, ScalarStyle, Span, Tag};

use crate::problem::Pos;

/// Largest file read (configuration or manifest), in bytes.
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 20;
/// Deepest nesting of lists and mappings.
pub(crate) const MAX_DEPTH: usize = 64;
/// Most values in one load (a configuration file, or a manifests directory).
pub(crate) const MAX_VALUES: usize = 1 << 20;
/// Most values that aliases may expand to in one load.
pub(crate) const MAX_ALIAS_VALUES: usize = 1 << 16;
/// Most YAML documents in one load.
pub(crate) const MAX_DOCUMENTS: usize = 10_000;

/// A YAML value and where it starts.
#[derive(Clone, Debug)]
pub struct Value {
    pos: Pos,
    data: Rc<Data>,
}

/// What a value holds.
#[derive(Debug)]
pub enum Data {
    /// `null`, `~` or nothing.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A whole number that fits in an `i64`.
    Int(i64),
    /// Any other number (a float, or an integer too large), as written.
    Number(String),
    /// A string.
    Str(String),
    /// A list.
    Seq(Vec<Value>),
    /// A mapping, in the order written (keys are unique).
    Map(Vec<(Value, Value)>),
    /// A value with an application tag (`!something`).
    Tagged(String, Value),
}

impl Value {
    fn new(pos: Pos, data: Data) -> Value {
        Value { pos, data: Rc::new(data) }
    }

    /// Where it starts (line 0 for a value that comes from no text, see
    /// [`Value::from_json`]).
    pub(crate) fn pos(&self) -> Pos {
        self.pos
    }

    /// Where it starts, when it was read from text.
    pub(crate) fn at(&self) -> Option<Pos> {
        (self.pos.line != 0).then_some(self.pos)
    }

    /// A value read from JSON (an object from the Kubernetes API): it has
    /// no position, so problems about it name only its origin and path.
    /// Depth is bounded by [`MAX_DEPTH`]: deeper values become null (what
    /// reads them then reports a missing or wrong field).
    pub(crate) fn from_json(v: &serde_json::Value) -> Value {
        Self::from_json_at(v, 0)
    }

    fn from_json_at(v: &serde_json::Value, depth: usize) -> Value {
        use serde_json::Value as J;
        let data = match v {
            J::Null => Data::Null,
            J::Bool(b) => Data::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Data::Int(i),
                None => Data::Number(n.to_string()),
            },
            J::String(s) => Data::Str(s.clone()),
            _ if depth >= MAX_DEPTH => Data::Null,
            J::Array(a) => Data::Seq(a.iter().map(|x| Self::from_json_at(x, depth + 1)).collect()),
            J::Object(m) => Data::Map(
                m.iter()
                    .map(|(k, x)| (Value::new(Pos::default(), Data::Str(k.clone())), Self::from_json_at(x, depth + 1)))
                    .collect(),
            ),
        };
        Value::new(Pos::default(), data)
    }

    /// The value as JSON (tags are dropped; numbers that fit neither `i64`
    /// nor `f64` become strings; non-string keys are written as text).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &*self.data {
            Data::Null => J::Null,
            Data::Bool(b) => J::Bool(*b),
            Data::Int(i) => J::from(*i),
            Data::Number(s) => s
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map_or_else(|| J::String(s.clone()), J::Number),
            Data::Str(s) => J::String(s.clone()),
            Data::Seq(items) => J::Array(items.iter().map(Value::to_json).collect()),
            Data::Map(pairs) => J::Object(
                pairs
                    .iter()
                    .map(|(k, v)| {
                        let key = match k.to_json() {
                            J::String(s) => s,
                            other => other.to_string(),
                        };
                        (key, v.to_json())
                    })
                    .collect(),
            ),
            Data::Tagged(_, v) => v.to_json(),
        }
    }

    /// What it holds.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// True for null.
    pub(crate) fn is_null(&self) -> bool {
        matches!(*self.data, Data::Null)
    }

    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match &*self.data {
            Data::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if it is one.
    pub(crate) fn as_bool(&self) -> Option<bool> {
        match *self.data {
            Data::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The pairs, if it is a mapping.
    pub(crate) fn as_map(&self) -> Option<&[(Value, Value)]> {
        match &*self.data {
            Data::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The value of string key `key`, if it is a mapping that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// What kind of value it is, for messages ("a list").
    pub(crate) fn kind(&self) -> &'static str {
        match &*self.data {
            Data::Null => "nothing",
            Data::Bool(_) => "a boolean",
            Data::Int(_) | Data::Number(_) => "a number",
            Data::Str(_) => "a string",
            Data::Seq(_) => "a list",
            Data::Map(_) => "a mapping",
            Data::Tagged(..) => "a tagged value",
        }
    }
}

/// Why YAML text was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YamlError {
    /// Where, when known.
    pub pos: Option<Pos>,
    /// Why.
    pub message: String,
    /// True when a limit stopped reading (rather than a mistake in the
    /// text): reading more of the same load would be refused too.
    pub(crate) limit: bool,
}

/// What one load may still use; shared by every file of a load.
#[derive(Clone, Debug)]
pub struct Budget {
    max_values: usize,
    max_alias_values: usize,
    max_documents: usize,
    values: usize,
    alias_values: usize,
    documents: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(MAX_VALUES, MAX_ALIAS_VALUES, MAX_DOCUMENTS)
    }
}

impl Budget {
    /// A budget of `values` values, of which aliases may expand to
    /// `alias_values`, in `documents` documents.
    pub(crate) fn new(values: usize, alias_values: usize, documents: usize) -> Budget {
        Budget { max_values: values, max_alias_values: alias_values, max_documents: documents, values: 0, alias_values: 0, documents: 0 }
    }
}

/// What kind of file `t` is, for a refusal.
fn kind(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading if it is a regular file, after following
/// symlinks (a ConfigMap mount is a chain of them). Anything else is
/// refused before it is read: opening a FIFO for reading waits for a
/// writer, and reading a device may never end. The type is looked at
/// before opening and again on the opened file (the path may be replaced
/// in between); the open itself never waits (`O_NONBLOCK`, which changes
/// nothing for a regular file).
pub fn open_regular(path: &Path) -> Result<std::fs::File, ReadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = |t: std::fs::FileType| ReadError::NotRegular(kind(t));
    let meta = std::fs::metadata(path).map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(ReadError::Io)?;
    let meta = f.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    Ok(f)
}

/// Why a file was not read ([`open_regular`], [`read`]).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening, inspecting or reading it failed.
    #[error("cannot read: {0}")]
    Io(#[source] std::io::Error),
    /// It is something else than a regular file: what it is (a
    /// directory, a FIFO...).
    #[error("not a regular file ({0}): refused")]
    NotRegular(&'static str),
    /// It is larger than the most read, given in MiB (rounded down).
    #[error("larger than {0} MiB: refused")]
    TooLarge(u64),
    /// It is not UTF-8: the offset of the first byte that is not.
    #[error("not UTF-8 text (byte {0})")]
    NotUtf8(usize),
}

/// Reads a text file of at most `max` bytes; it must be a regular file
/// ([`open_regular`]).
pub(crate) fn read(path: &Path, max: u64) -> Result<String, ReadError> {
    let mut f = open_regular(path)?;
    let too_large = || ReadError::TooLarge(max >> 20);
    if f.metadata().is_ok_and(|m| m.is_file() && m.len() > max) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    (&mut f).take(max + 1).read_to_end(&mut bytes).map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8(e.utf8_error().valid_up_to()))
}

fn pos_of(m: Marker) -> Pos {
    Pos {
        line: u32::try_from(m.line()).unwrap_or(u32::MAX),
        column: u32::try_from(m.col() + 1).unwrap_or(u32::MAX),
    }
}

/// The documents of `text`, in order. Reading stops at the first error,
/// returned with the index of the document it is in; the documents before
/// it are returned too.
pub fn documents(text: &str, budget: &mut Budget) -> (Vec<Value>, Option<(usize, YamlError)>) {
    let mut b = Builder { budget, docs: Vec::new(), stack: Vec::new(), anchors: HashMap::new(), root: None };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, span) = match parser.next_event() {
            None => break,
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                let index = b.docs.len();
                return (b.docs, Some((index, err(pos_of(*e.marker()), format!("not valid YAML: {}", e.info())))));
            }
        };
        if let Err(e) = b.event(event, &span) {
            let index = b.docs.len();
            return (b.docs, Some((index, e)));
        }
    }
    (b.docs, None)
}

/// The single document of `text` (null when there is none).
pub fn document(text: &str, budget: &mut Budget) -> Result<Value, YamlError> {
    let (mut docs, error) = documents(text, budget);
    if let Some((_, e)) = error {
        return Err(e);
    }
    match docs.len() {
        0 => Ok(Value::new(Pos { line: 1, column: 1 }, Data::Null)),
        1 => Ok(docs.swap_remove(0)),
        _ => Err(err(docs[1].pos(), "a second YAML document: this file holds one")),
    }
}

struct Anchor {
    value: Value,
    size: usize,
    height: usize,
}

enum Open {
    Seq(Vec<Value>),
    Map { pairs: Vec<(Value, Value)>, key: Option<Value>, seen: HashMap<String, Pos> },
}

struct Frame {
    open: Open,
    pos: Pos,
    anchor: usize,
    tag: Option<String>,
    /// `Builder::used` before it opened.
    used_before: usize,
    /// Tallest child (0 for scalars only).
    height: usize,
}

struct Builder<'b> {
    budget: &'b mut Budget,
    docs: Vec<Value>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchor>,
    root: Option<Value>,
}

fn err(pos: Pos, message: impl Into<String>) -> YamlError {
    YamlError { pos: Some(pos), message: message.into(), limit: false }
}

fn refused(pos: Pos, message: impl Into<String>) -> YamlError {
    YamlError { pos: Some(pos), message: message.into(), limit: true }
}

/// An application tag as written, or `None` for the core schema's tags.
fn app_tag(tag: Option<&Tag>) -> Option<String> {
    let t = tag?;
    (!t.is_yaml_core_schema()).then(|| format!("{}{}", t.handle, t.suffix))
}

impl Builder<'_> {
    fn used(&self) -> usize {
        self.budget.values
    }

    fn take(&mut self, pos: Pos, n: usize) -> Result<(), YamlError> {
        let b = &mut *self.budget;
        if n > b.max_values - b.values {
            return Err(refused(pos, format!("more than {} values: refused", b.max_values)));
        }
        b.values += n;
        Ok(())
    }

    /// Takes the parser's next event (at `span`) into the tree, within the
    /// limits and the budget.
    fn event(&mut self, event: Event<'_>, span: &Span) -> Result<(), YamlError> {
        let pos = pos_of(span.start);
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd => Ok(()),
            Event::DocumentStart(_) => {
                let b = &mut *self.budget;
                if b.documents == b.max_documents {
                    return Err(refused(pos, format!("more than {} YAML documents: refused", b.max_documents)));
                }
                b.documents += 1;
                self.root = None;
                Ok(())
            }
            Event::DocumentEnd => {
                let root = self.root.take().unwrap_or_else(|| Value::new(pos, Data::Null));
                self.docs.push(root);
                self.anchors.clear();
                Ok(())
            }
            Event::Scalar(text, style, anchor, tag) => self.scalar(pos, text, style, anchor, tag.as_deref()),
            Event::SequenceStart(anchor, ref tag) | Event::MappingStart(anchor, ref tag) => {
                let is_seq = matches!(event, Event::SequenceStart(..));
                self.open(pos, is_seq, anchor, tag.as_deref())
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(pos),
            Event::Alias(id) => self.alias(pos, id),
        }
    }

    /// A scalar at `pos`: one value, typed by the core schema unless it
    /// is quoted or tagged `!!str`.
    fn scalar(&mut self, pos: Pos, text: Cow<'_, str>, style: ScalarStyle, anchor: usize, tag: Option<&Tag>) -> Result<(), YamlError> {
        self.take(pos, 1)?;
        let data = match (style, tag) {
            (_, Some(t)) if t.is_yaml_core_schema() && t.suffix == "str" => Data::Str(text.into_owned()),
            (ScalarStyle::Plain, _) => plain(text.into_owned()),
            _ => Data::Str(text.into_owned()),
        };
        let mut v = Value::new(pos, data);
        if let Some(t) = app_tag(tag) {
            v = Value::new(pos, Data::Tagged(t, v));
        }
        self.done(v, anchor, 1, 0)
    }

    /// The start of a list (`is_seq`) or a mapping at `pos`: one value,
    /// open until its end, one level deeper.
    fn open(&mut self, pos: Pos, is_seq: bool, anchor: usize, tag: Option<&Tag>) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(refused(pos, format!("lists and mappings nest deeper than {MAX_DEPTH} levels: refused")));
        }
        self.take(pos, 1)?;
        let open = if is_seq {
            Open::Seq(Vec::new())
        } else {
            Open::Map { pairs: Vec::new(), key: None, seen: HashMap::new() }
        };
        let used_before = self.used() - 1;
        self.stack.push(Frame { open, pos, anchor, tag: app_tag(tag), used_before, height: 0 });
        Ok(())
    }

    /// The end (at `pos`) of the innermost open list or mapping: complete,
    /// with every value taken since it opened.
    fn close(&mut self, pos: Pos) -> Result<(), YamlError> {
        let Some(f) = self.stack.pop() else { return Err(err(pos, "unbalanced end of a list or mapping")) };
        let data = match f.open {
            Open::Seq(items) => Data::Seq(items),
            Open::Map { pairs, .. } => Data::Map(pairs),
        };
        let mut v = Value::new(f.pos, data);
        if let Some(t) = f.tag {
            v = Value::new(f.pos, Data::Tagged(t, v));
        }
        let size = self.used() - f.used_before;
        self.done(v, f.anchor, size, f.height + 1)
    }

    /// An alias at `pos` to anchor `id`: the anchored value shared, not
    /// copied, but counted at its full size and height against the limits.
    fn alias(&mut self, pos: Pos, id: usize) -> Result<(), YamlError> {
        let Some(a) = self.anchors.get(&id) else {
            return Err(err(pos, "an alias to a node that encloses it, or to no node"));
        };
        let (value, size, height) = (a.value.clone(), a.size, a.height);
        if self.stack.len() + height > MAX_DEPTH {
            return Err(refused(pos, format!("lists and mappings nest deeper than {MAX_DEPTH} levels: refused")));
        }
        let b = &mut *self.budget;
        if size > b.max_alias_values - b.alias_values {
            return Err(refused(
                pos,
                format!(
                    "aliases expand to more than {} values: refused (a \"billion laughs\" document?)",
                    b.max_alias_values
                ),
            ));
        }
        b.alias_values += size;
        self.take(pos, size)?;
        self.done(Value { pos, data: value.data }, 0, size, height)
    }

    /// A complete value of `size` values and `height` levels: into its
    /// parent, or the document's root.
    fn done(&mut self, v: Value, anchor: usize, size: usize, height: usize) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, Anchor { value: v.clone(), size, height });
        }
        let Some(top) = self.stack.last_mut() else {
            self.root = Some(v);
            return Ok(());
        };
        top.height = top.height.max(height);
        match &mut top.open {
            Open::Seq(items) => items.push(v),
            Open::Map { pairs, key, seen } => match key.take() {
                Some(k) => pairs.push((k, v)),
                None => {
                    let text = match v.data() {
                        Data::Str(s) | Data::Number(s) => Some(s.clone()),
                        Data::Int(i) => Some(i.to_string()),
                        Data::Bool(b) => Some(b.to_string()),
                        Data::Null => Some(String::new()),
                        _ => None,
                    };
                    if let Some(text) = text {
                        if let Some(first) = seen.get(&text) {
                            return Err(err(
                                v.pos(),
                                format!("key {text:?} appears twice in a mapping (first at line {}, column {})", first.line, first.column),
                            ));
                        }
                        seen.insert(text, v.pos());
                    }
                    *key = Some(v);
                }
            },
        }
        Ok(())
    }
}

/// A plain scalar under the core schema.
fn plain(s: String) -> Data {
    match s.as_str() {
        "" | "~" | "null" | "Null" | "NULL" => return Data::Null,
        "true" | "True" | "TRUE" => return Data::Bool(true),
        "false" | "False" | "FALSE" => return Data::Bool(false),
        _ => {}
    }
    if let Some(n) = integer(&s) {
        return n.map_or(Data::Number(s), Data::Int);
    }
    if is_float(&s) {
        return Data::Number(s);
    }
    Data::Str(s)
}

/// `Some(Some(n))` for an integer that fits, `Some(None)` for one that does
/// not, `None` for text that is no integer.
fn integer(s: &str) -> Option<Option<i64>> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (digits, radix) = if let Some(h) = body.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = body.strip_prefix("0o") {
        (o, 8)
    } else {
        (body, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) || (radix != 10 && s.starts_with(['-', '+'])) {
        return None;
    }
    let n = i64::from_str_radix(digits, radix).ok();
    Some(if neg { n.and_then(i64::checked_neg) } else { n })
}

fn is_float(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if matches!(body, ".inf" | ".Inf" | ".INF") || matches!(s, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    let (mantissa, exp) = match body.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (body, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let digits = |t: &str| t.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = match frac {
        Some(f) => digits(int) && digits(f) && !(int.is_empty() && f.is_empty()),
        None => !int.is_empty() && digits(int),
    };
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exp_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<Value, YamlError> {
        document(text, &mut Budget::default())
    }

    #[test]
    fn scalars_follow_the_core_schema() {
        let v = one("a: 1\nb: '1'\nc: 0x10\nd: 1.5\ne: ~\nf: true\ng: !!str 7\nh: 99999999999999999999\ni: x1\nj: -3").unwrap();
        let d = |k: &str| format!("{:?}", v.get(k).unwrap().data());
        assert_eq!(d("a"), "Int(1)");
        assert_eq!(d("b"), "Str(\"1\")");
        assert_eq!(d("c"), "Int(16)");
        assert_eq!(d("d"), "Number(\"1.5\")");
        assert_eq!(d("e"), "Null");
        assert_eq!(d("f"), "Bool(true)");
        assert_eq!(d("g"), "Str(\"7\")");
        assert_eq!(d("h"), "Number(\"99999999999999999999\")");
        assert_eq!(d("i"), "Str(\"x1\")");
        assert_eq!(d("j"), "Int(-3)");
    }

    #[test]
    fn values_know_their_line_and_column() {
        let v = one("ports:\n  - name: front\n    mtu: 1500\n  - {name: back}\n").unwrap();
        let ports = v.get("ports").unwrap();
        let Data::Seq(items) = ports.data() else { panic!() };
        assert_eq!(items[0].get("mtu").unwrap().pos(), Pos { line: 3, column: 10 });
        assert_eq!(items[0].pos(), Pos { line: 2, column: 5 }, "a block mapping starts at its first key");
        assert_eq!(items[1].pos(), Pos { line: 4, column: 5 }, "a flow mapping at its brace");
    }

    #[test]
    fn syntax_errors_and_duplicate_keys_have_positions() {
        let e = one("a: 1\nb: [1, 2\n").unwrap_err();
        assert!(e.message.starts_with("not valid YAML"), "{e:?}");
        assert!(e.pos.is_some());
        let e = one("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e, err(Pos { line: 3, column: 1 }, "key \"a\" appears twice in a mapping (first at line 1, column 1)"));
        let e = one("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(e.pos, Some(Pos { line: 3, column: 1 }));
    }

    #[test]
    fn aliases_share_and_are_bounded() {
        let v = one("a: &x {k: [1, 2]}\nb: *x\n").unwrap();
        assert_eq!(v.get("b").unwrap().get("k").unwrap().pos(), Pos { line: 1, column: 11 }, "inside: the anchor's places");
        assert_eq!(v.get("b").unwrap().pos(), Pos { line: 2, column: 4 }, "the alias itself: where it is written");
        let mut lol = String::from("l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for i in 1..10 {
            let p = i - 1;
            lol.push_str(&format!("l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"));
        }
        let e = one(&lol).unwrap_err();
        assert!(e.message.contains("billion laughs"), "{e:?}");
        // Refused where the expansion first passes the limit, not after
        // expanding l5..l9 (10^10 nodes): that it stops early is shown by
        // where, not by a clock.
        assert_eq!(e.pos.map(|p| p.line), Some(5), "refused at the first alias past the limit (in l4)");
        let e = one("a: &a [x]\nb: &b [*a, *a]\nc: *c\n").unwrap_err();
        assert!(e.message.contains("not valid YAML"), "unknown anchors are the parser's: {e:?}");
    }

    #[test]
    fn depth_and_values_are_bounded() {
        let deep = "- ".repeat(100_000) + "x";
        let e = one(&deep).unwrap_err();
        assert_eq!(e.pos, Some(Pos { line: 1, column: 129 }), "the 65th level: {e:?}");
        assert!(e.message.contains("deeper than 64"));
        let e = one(&"[".repeat(1_000_000)).unwrap_err();
        assert!(e.message.contains("recursion limit"), "the parser's own limit comes first in flow style: {e:?}");
        let ok = format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(one(&ok).is_ok(), "64 levels are fine");
        let alias_deep = format!("a: &a {}1{}\nb: [[*a]]\n", "[".repeat(63), "]".repeat(63));
        assert!(one(&alias_deep).unwrap_err().message.contains("deeper than 64"), "aliases count where they land");
        let mut small = Budget::new(10, 10, 10);
        let (docs, e) = documents("[1, 2, 3]\n---\n[4, 5, 6, 7, 8, 9, 10]\n", &mut small);
        assert_eq!(docs.len(), 1);
        let (doc, e) = e.unwrap();
        assert_eq!((doc, e.pos), (1, Some(Pos { line: 3, column: 17 })), "the budget is shared across documents");
        let mut two = Budget::new(10, 10, 2);
        let (docs, e) = documents("a\n---\nb\n", &mut two);
        assert_eq!((docs.len(), e), (2, None));
        let (_, e) = documents("c\n", &mut two);
        assert_eq!(e.unwrap(), (0, refused(Pos { line: 1, column: 1 }, "more than 2 YAML documents: refused")), "counted across texts");
    }

    #[test]
    fn files_are_bounded() {
        let dir = std::env::temp_dir().join(format!("sluice-yaml-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("big.yaml");
        std::fs::write(&f, vec![b'#'; 2048]).unwrap();
        assert_eq!(read(&f, 1024).unwrap_err().to_string(), "larger than 0 MiB: refused");
        assert_eq!(read(&f, 4096).unwrap().len(), 2048);
        assert_eq!(read(Path::new("/dev/zero"), 1 << 20).unwrap_err().to_string(), "not a regular file (a character device): refused", "endless files too");
        std::fs::write(&f, [b'a', 0xff]).unwrap();
        assert!(read(&f, 1024).unwrap_err().to_string().contains("not UTF-8"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Opening a FIFO for reading waits for a writer: it is refused before
    /// that, also behind a symlink.
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = std::env::temp_dir().join(format!("sluice-yaml-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo.yaml");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let link = dir.join("link.yaml");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        for p in [fifo, link, dir.clone()] {
            let (tx, rx) = std::sync::mpsc::channel();
            let q = p.clone();
            std::thread::spawn(move || tx.send(read(&q, 1024)));
            let got = rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap_or_else(|_| panic!("reading {} blocked", p.display()));
            let want = if p == dir { "not a regular file (a directory): refused" } else { "not a regular file (a FIFO): refused" };
            assert_eq!(got.unwrap_err().to_string(), want, "{}", p.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
