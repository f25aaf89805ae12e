//! Row conditions from untrusted text (a signal row's `additional-conditions` filter,
//! `walpost replay --where`): parsed into a small grammar and written back as SQL that
//! can only compare the outbox's own columns with constants.
//!
//! The grammar (keywords case-insensitive):
//!
//! ```text
//! condition := or
//! or        := and ("OR" and)*
//! and       := not ("AND" not)*
//! not       := "NOT" not | "(" condition ")" | predicate | "TRUE" | "FALSE"
//! predicate := column cmp value
//!            | column ["NOT"] "IN" "(" value ("," value)* ")"
//!            | column ["NOT"] "BETWEEN" value "AND" value
//!            | column "IS" ["NOT"] ("NULL" | "TRUE" | "FALSE")
//!            | column ["NOT"] ("LIKE" | "ILIKE") value
//! cmp       := "=" | "<>" | "!=" | "<" | "<=" | ">" | ">="
//! value     := term (("+" | "-") term)*
//! term      := "-" term | "(" value ")" | number | 'string' ["::" type] | type 'string'
//!            | "TRUE" | "FALSE" | "NOW()" | "CURRENT_TIMESTAMP" | "CURRENT_DATE" | "NULL"
//! column    := name | "quoted name"
//! type      := one of [`TYPES`]
//! ```
//!
//! Invariants: the SQL made from a [`Condition`] names no function but `pg_catalog.now()` (and
//! the two SQL constants), no relation, no operator outside the grammar; column names
//! are quoted identifiers and strings bind parameters (`$n`), never SQL text. Numbers stay
//! in the text as the tokenizer read them (digits, one dot, an exponent): a parameter
//! would take the column's type and refuse `id > 1.5` or `1 + 2`, which the constant
//! allows. Nesting is bounded by [`MAX_DEPTH`] and the text
//! by [`MAX_LEN`], so a hostile condition cannot exhaust the parser. Whether a column
//! exists is the server's to say (walpost parses the query before it runs it).

use std::fmt::Write as _;

/// `name` as a quoted SQL identifier (as `replication::quote_ident` quotes it).
fn ident(name: &str) -> String {
    postgres_protocol::escape::escape_identifier(name)
}

/// Longest condition text accepted.
pub const MAX_LEN: usize = 8 * 1024;
/// Deepest nesting of parentheses and NOTs accepted.
pub const MAX_DEPTH: usize = 32;

/// The types a constant may be cast to.
pub const TYPES: &[&str] = &[
    "text",
    "varchar",
    "uuid",
    "int",
    "integer",
    "int4",
    "bigint",
    "int8",
    "smallint",
    "numeric",
    "boolean",
    "bool",
    "date",
    "timestamp",
    "timestamptz",
    "interval",
    "jsonb",
];

/// A condition that failed to parse: what was found where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at character {at}")]
pub struct ConditionError {
    pub what: String,
    /// 1-based character position.
    pub at: usize,
}

/// A parsed condition (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    Or(Vec<Condition>),
    And(Vec<Condition>),
    Not(Box<Condition>),
    Bool(bool),
    Compare { column: String, op: &'static str, value: Value },
    In { column: String, negated: bool, values: Vec<Value> },
    Between { column: String, negated: bool, low: Value, high: Value },
    Is { column: String, negated: bool, what: &'static str },
    Like { column: String, negated: bool, op: &'static str, pattern: Value },
}

/// A constant expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A number as written (digits, one dot, an exponent).
    Number(String),
    /// A string with an optional cast.
    Text {
        text: String,
        cast: Option<&'static str>,
    },
    Bool(bool),
    Now,
    CurrentTimestamp,
    CurrentDate,
    Null,
    Negative(Box<Value>),
    Arith {
        left: Box<Value>,
        op: char,
        right: Box<Value>,
    },
}

/// Parses `text` (see the module docs).
pub fn parse(text: &str) -> Result<Condition, ConditionError> {
    if text.len() > MAX_LEN {
        return Err(ConditionError { what: format!("the condition is longer than {MAX_LEN} bytes"), at: 1 });
    }
    let tokens = tokenize(text)?;
    let mut p = Parser { tokens, pos: 0, depth: 0 };
    let c = p.or()?;
    match p.peek() {
        None => Ok(c),
        Some(t) => Err(p.error(format!("unexpected {}", t.kind.describe()))),
    }
}

impl Condition {
    /// The condition as SQL (see the module's invariants): each string is appended to
    /// `params` and written as `$n`, its place there (`params` may already hold the values
    /// of the statement's other parameters).
    pub fn to_sql(&self, params: &mut Vec<String>) -> String {
        let mut out = String::new();
        self.write(&mut out, &mut |text| {
            params.push(text.to_owned());
            format!("${}", params.len())
        });
        out
    }

    /// Writes the condition; `bind` gives what stands for a string.
    fn write(&self, out: &mut String, bind: &mut dyn FnMut(&str) -> String) {
        let list = |out: &mut String, bind: &mut dyn FnMut(&str) -> String, items: &[Condition], sep: &str| {
            out.push('(');
            for (i, c) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                c.write(out, bind);
            }
            out.push(')');
        };
        match self {
            Condition::Or(items) => list(out, bind, items, " OR "),
            Condition::And(items) => list(out, bind, items, " AND "),
            Condition::Not(c) => {
                out.push_str("(NOT ");
                c.write(out, bind);
                out.push(')');
            }
            Condition::Bool(b) => out.push_str(if *b { "TRUE" } else { "FALSE" }),
            Condition::Compare { column, op, value } => {
                let _ = write!(out, "({} {op} {})", ident(column), value.to_sql(bind));
            }
            Condition::In { column, negated, values } => {
                let values: Vec<String> = values.iter().map(|v| v.to_sql(bind)).collect();
                let not = if *negated { "NOT " } else { "" };
                let _ = write!(out, "({} {not}IN ({}))", ident(column), values.join(", "));
            }
            Condition::Between { column, negated, low, high } => {
                let not = if *negated { "NOT " } else { "" };
                let (low, high) = (low.to_sql(bind), high.to_sql(bind));
                let _ = write!(out, "({} {not}BETWEEN {low} AND {high})", ident(column));
            }
            Condition::Is { column, negated, what } => {
                let not = if *negated { "NOT " } else { "" };
                let _ = write!(out, "({} IS {not}{what})", ident(column), what = what);
            }
            Condition::Like { column, negated, op, pattern } => {
                let not = if *negated { "NOT " } else { "" };
                let _ = write!(out, "({} {not}{op} {})", ident(column), pattern.to_sql(bind));
            }
        }
    }
}

impl Value {
    fn to_sql(&self, bind: &mut dyn FnMut(&str) -> String) -> String {
        match self {
            Value::Number(n) => n.clone(),
            Value::Text { text, cast: None } => bind(text),
            Value::Text { text, cast: Some(t) } => format!("{}::{t}", bind(text)),
            Value::Bool(b) => if *b { "TRUE" } else { "FALSE" }.into(),
            Value::Now => "pg_catalog.now()".into(),
            Value::CurrentTimestamp => "CURRENT_TIMESTAMP".into(),
            Value::CurrentDate => "CURRENT_DATE".into(),
            Value::Null => "NULL".into(),
            Value::Negative(v) => format!("(-{})", v.to_sql(bind)),
            Value::Arith { left, op, right } => {
                let (left, right) = (left.to_sql(bind), right.to_sql(bind));
                format!("({left} {op} {right})")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Word(String),
    Quoted(String),
    Str(String),
    Number(String),
    Symbol(&'static str),
}

impl Kind {
    fn describe(&self) -> String {
        match self {
            Kind::Word(w) => format!("'{w}'"),
            Kind::Quoted(q) => format!("column {q:?}"),
            Kind::Str(_) => "a string".into(),
            Kind::Number(n) => format!("number {n}"),
            Kind::Symbol(s) => format!("'{s}'"),
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    kind: Kind,
    at: usize,
}

const SYMBOLS: &[&str] = &["<=", ">=", "<>", "!=", "::", "=", "<", ">", "(", ")", ",", "+", "-"];

const COMPARISONS: &[&str] = &["<=", ">=", "<>", "!=", "=", "<", ">"];

fn tokenize(text: &str) -> Result<Vec<Token>, ConditionError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let at = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(ConditionError { what: "a string is not closed".into(), at }),
                    Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                        s.push('\'');
                        i += 2;
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            out.push(Token { kind: Kind::Str(s), at });
        } else if c == '"' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(ConditionError { what: "a quoted column name is not closed".into(), at }),
                    Some('"') if chars.get(i + 1) == Some(&'"') => {
                        s.push('"');
                        i += 2;
                    }
                    Some('"') => {
                        i += 1;
                        break;
                    }
                    Some(&ch) => {
                        s.push(ch);
                        i += 1;
                    }
                }
            }
            if s.is_empty() {
                return Err(ConditionError { what: "an empty quoted column name".into(), at });
            }
            out.push(Token { kind: Kind::Quoted(s), at });
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            let start = i;
            let mut dot = false;
            while let Some(&d) = chars.get(i) {
                if d.is_ascii_digit() {
                    i += 1;
                } else if d == '.' && !dot {
                    dot = true;
                    i += 1;
                } else if (d == 'e' || d == 'E')
                    && chars.get(i + 1).is_some_and(|n| n.is_ascii_digit() || *n == '-' || *n == '+')
                {
                    i += 2;
                    while chars.get(i).is_some_and(char::is_ascii_digit) {
                        i += 1;
                    }
                    break;
                } else {
                    break;
                }
            }
            let number: String = chars.get(start..i).unwrap_or_default().iter().collect();
            out.push(Token { kind: Kind::Number(number), at });
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while chars.get(i).is_some_and(|d| d.is_alphanumeric() || *d == '_' || *d == '$') {
                i += 1;
            }
            let word: String = chars.get(start..i).unwrap_or_default().iter().collect();
            out.push(Token { kind: Kind::Word(word.to_lowercase()), at });
        } else {
            let rest: String = chars.get(i..(i + 2).min(chars.len())).unwrap_or_default().iter().collect();
            let Some(sym) = SYMBOLS.iter().find(|s| rest.starts_with(**s)) else {
                return Err(ConditionError { what: format!("'{c}' is not part of a condition walpost runs"), at });
            };
            i += sym.chars().count();
            out.push(Token { kind: Kind::Symbol(sym), at });
        }
    }
    Ok(out)
}

/// Words that are never column names without quotes (they would make the grammar
/// ambiguous or hide a keyword the grammar does not have, like SELECT).
const RESERVED: &[&str] = &[
    "and", "or", "not", "in", "between", "is", "null", "true", "false", "like", "ilike", "select", "from", "where",
    "union", "exists", "case", "when", "then", "else", "end", "array", "row", "any", "all", "some", "similar",
];

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn at(&self) -> usize {
        self.peek().map_or_else(|| self.tokens.last().map_or(1, |t| t.at + 1), |t| t.at)
    }

    fn error(&self, what: impl Into<String>) -> ConditionError {
        ConditionError { what: what.into(), at: self.at() }
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token { kind: Kind::Word(w), .. }) if w == word)
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let yes = self.is_word(word);
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn is_symbol(&self, symbol: &str) -> bool {
        matches!(self.peek(), Some(Token { kind: Kind::Symbol(s), .. }) if *s == symbol)
    }

    fn eat_symbol(&mut self, symbol: &str) -> bool {
        let yes = self.is_symbol(symbol);
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn expect_symbol(&mut self, symbol: &str) -> Result<(), ConditionError> {
        if self.eat_symbol(symbol) {
            Ok(())
        } else {
            Err(self.error(format!("expected '{symbol}'")))
        }
    }

    fn deeper(&mut self) -> Result<(), ConditionError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(format!("the condition nests deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Condition, ConditionError> {
        let mut items = vec![self.and()?];
        while self.eat_word("or") {
            items.push(self.and()?);
        }
        Ok(if items.len() == 1 { items.swap_remove(0) } else { Condition::Or(items) })
    }

    fn and(&mut self) -> Result<Condition, ConditionError> {
        let mut items = vec![self.not()?];
        while self.eat_word("and") {
            items.push(self.not()?);
        }
        Ok(if items.len() == 1 { items.swap_remove(0) } else { Condition::And(items) })
    }

    fn not(&mut self) -> Result<Condition, ConditionError> {
        if self.eat_word("not") {
            self.deeper()?;
            let c = self.not()?;
            self.depth -= 1;
            return Ok(Condition::Not(Box::new(c)));
        }
        if self.eat_symbol("(") {
            self.deeper()?;
            let c = self.or()?;
            self.expect_symbol(")")?;
            self.depth -= 1;
            return Ok(c);
        }
        if self.eat_word("true") {
            return Ok(Condition::Bool(true));
        }
        if self.eat_word("false") {
            return Ok(Condition::Bool(false));
        }
        self.predicate()
    }

    fn column(&mut self) -> Result<String, ConditionError> {
        match self.peek().map(|t| t.kind.clone()) {
            Some(Kind::Quoted(q)) => {
                self.pos += 1;
                Ok(q)
            }
            Some(Kind::Word(w)) if !RESERVED.contains(&w.as_str()) => {
                self.pos += 1;
                if self.is_symbol("(") {
                    self.pos -= 1;
                    return Err(self.error(format!(
                        "'{w}(' is a function call: a condition compares columns with constants only"
                    )));
                }
                Ok(w)
            }
            Some(k) => Err(self.error(format!("expected a column name, found {}", k.describe()))),
            None => Err(self.error("expected a column name, found the end")),
        }
    }

    fn predicate(&mut self) -> Result<Condition, ConditionError> {
        let column = self.column()?;
        if let Some(Token { kind: Kind::Symbol(op), .. }) = self.peek() {
            let op: &'static str = op;
            if COMPARISONS.contains(&op) {
                self.pos += 1;
                let op = if op == "!=" { "<>" } else { op };
                return Ok(Condition::Compare { column, op, value: self.value()? });
            }
        }
        if self.eat_word("is") {
            let negated = self.eat_word("not");
            let what = match self.next().map(|t| t.kind) {
                Some(Kind::Word(w)) if w == "null" => "NULL",
                Some(Kind::Word(w)) if w == "true" => "TRUE",
                Some(Kind::Word(w)) if w == "false" => "FALSE",
                _ => {
                    self.pos -= 1;
                    return Err(self.error("expected NULL, TRUE or FALSE after IS"));
                }
            };
            return Ok(Condition::Is { column, negated, what });
        }
        let negated = self.eat_word("not");
        if self.eat_word("in") {
            self.expect_symbol("(")?;
            let mut values = vec![self.value()?];
            while self.eat_symbol(",") {
                values.push(self.value()?);
            }
            self.expect_symbol(")")?;
            return Ok(Condition::In { column, negated, values });
        }
        if self.eat_word("between") {
            let low = self.value()?;
            if !self.eat_word("and") {
                return Err(self.error("expected AND in BETWEEN"));
            }
            let high = self.value()?;
            return Ok(Condition::Between { column, negated, low, high });
        }
        for (word, op) in [("like", "LIKE"), ("ilike", "ILIKE")] {
            if self.eat_word(word) {
                return Ok(Condition::Like { column, negated, op, pattern: self.value()? });
            }
        }
        Err(self.error("expected a comparison (=, <>, <, <=, >, >=), IN, BETWEEN, IS or LIKE"))
    }

    fn value(&mut self) -> Result<Value, ConditionError> {
        let mut left = self.term()?;
        loop {
            let op = if self.eat_symbol("+") {
                '+'
            } else if self.eat_symbol("-") {
                '-'
            } else {
                return Ok(left);
            };
            let right = self.term()?;
            left = Value::Arith { left: Box::new(left), op, right: Box::new(right) };
        }
    }

    fn cast(&mut self) -> Result<Option<&'static str>, ConditionError> {
        if !self.eat_symbol("::") {
            return Ok(None);
        }
        match self.next().map(|t| t.kind) {
            Some(Kind::Word(w)) => match TYPES.iter().find(|t| **t == w) {
                Some(t) => Ok(Some(t)),
                None => {
                    self.pos -= 1;
                    Err(self.error(format!("'{w}' is not a type a condition may cast to ({})", TYPES.join(", "))))
                }
            },
            _ => {
                self.pos -= 1;
                Err(self.error("expected a type name after '::'"))
            }
        }
    }

    fn term(&mut self) -> Result<Value, ConditionError> {
        let Some(token) = self.next() else { return Err(self.error("expected a constant, found the end")) };
        match token.kind {
            Kind::Symbol("-") => {
                self.deeper()?;
                let v = self.term()?;
                self.depth -= 1;
                Ok(Value::Negative(Box::new(v)))
            }
            Kind::Symbol("(") => {
                self.deeper()?;
                let v = self.value()?;
                self.expect_symbol(")")?;
                self.depth -= 1;
                Ok(v)
            }
            Kind::Number(n) => Ok(Value::Number(n)),
            Kind::Str(text) => Ok(Value::Text { text, cast: self.cast()? }),
            Kind::Word(w) => match w.as_str() {
                "null" => Ok(Value::Null),
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                "current_timestamp" => Ok(Value::CurrentTimestamp),
                "current_date" => Ok(Value::CurrentDate),
                "now" => {
                    self.expect_symbol("(")?;
                    self.expect_symbol(")")?;
                    Ok(Value::Now)
                }
                word => match (TYPES.iter().find(|t| **t == word), self.peek().map(|t| t.kind.clone())) {
                    (Some(t), Some(Kind::Str(text))) => {
                        self.pos += 1;
                        Ok(Value::Text { text, cast: Some(t) })
                    }
                    _ => {
                        self.pos -= 1;
                        Err(self.error(format!(
                            "'{word}' is not a constant: compare a column with a number, a string, NOW() or CURRENT_TIMESTAMP (columns on the right and function calls are not part of a condition walpost runs)"
                        )))
                    }
                },
            },
            other => {
                self.pos -= 1;
                Err(self.error(format!("expected a constant, found {}", other.describe())))
            }
        }
    }
}

#[cfg(test)]
mod tests;
