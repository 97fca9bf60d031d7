//! The scanner: turns template text into tokens with the same boundaries as
//! Go's `text/template/parse` lexer (`lexText`, `lexInsideAction` and
//! friends), including its trim-marker and comment rules.
//!
//! Go's lexer hands an error token to the parser, which always reaches it
//! (the error ends the token stream), so failing here at once refuses exactly
//! the same templates.

/// What a token is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    Text,
    LeftDelim,
    RightDelim,
    Space,
    Assign,
    Declare,
    Pipe,
    LeftParen,
    RightParen,
    /// Any other printable ASCII character inside an action (`,` for example).
    Char,
    String,
    RawString,
    CharConstant,
    Complex,
    Number,
    Bool,
    Variable,
    Field,
    Identifier,
    Dot,
    Eof,
    Block,
    Break,
    Continue,
    Define,
    Else,
    End,
    If,
    Nil,
    Range,
    Template,
    With,
}

/// One token: its kind and its byte span in the template text.
#[derive(Clone, Copy, Debug)]
pub(super) struct Token {
    pub kind: Kind,
    pub start: usize,
    pub end: usize,
}

/// A scanning failure: the byte offset and what went wrong.
pub(super) type LexError = (usize, String);

const LEFT: &[u8] = b"{{";
const RIGHT: &[u8] = b"}}";

fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\n')
}

/// Go's `isAlphaNumeric` restricted to ASCII; non-ASCII letters are refused
/// by the caller (Go would accept them only in variable names).
fn is_alphanumeric(byte: u8) -> bool {
    byte == b'_' || byte.is_ascii_alphanumeric()
}

fn has_left_trim_marker(rest: &[u8]) -> bool {
    rest.len() >= 2 && rest[0] == b'-' && is_space(rest[1])
}

fn has_right_trim_marker(rest: &[u8]) -> bool {
    rest.len() >= 2 && is_space(rest[0]) && rest[1] == b'-'
}

struct Lexer<'t> {
    input: &'t [u8],
    pos: usize,
    start: usize,
    paren_depth: usize,
    tokens: Vec<Token>,
}

/// Scans the whole template.
pub(super) fn lex(text: &str) -> Result<Vec<Token>, LexError> {
    let mut lexer = Lexer {
        input: text.as_bytes(),
        pos: 0,
        start: 0,
        paren_depth: 0,
        tokens: Vec::new(),
    };
    lexer.run()?;
    Ok(lexer.tokens)
}

impl Lexer<'_> {
    fn byte_at(&self, index: usize) -> Option<u8> {
        self.input.get(index).copied()
    }

    fn rest(&self) -> &[u8] {
        self.input.get(self.pos..).unwrap_or(&[])
    }

    fn emit(&mut self, kind: Kind) {
        self.tokens.push(Token {
            kind,
            start: self.start,
            end: self.pos,
        });
        self.start = self.pos;
    }

    fn error<T>(&self, message: impl Into<String>) -> Result<T, LexError> {
        Err((self.start, message.into()))
    }

    fn at_right_delim(&self) -> (bool, bool) {
        let rest = self.rest();
        if has_right_trim_marker(rest) && rest[2..].starts_with(RIGHT) {
            return (true, true);
        }
        (rest.starts_with(RIGHT), false)
    }

    /// Go's `atTerminator`: what may follow an identifier, field or variable.
    fn at_terminator(&self) -> bool {
        match self.byte_at(self.pos) {
            None => true,
            Some(byte) if is_space(byte) => true,
            Some(b'.' | b',' | b'|' | b':' | b')' | b'(') => true,
            Some(_) => self.rest().starts_with(RIGHT),
        }
    }

    fn run(&mut self) -> Result<(), LexError> {
        loop {
            // Text up to the next "{{".
            let Some(offset) = find(self.rest(), LEFT) else {
                self.pos = self.input.len();
                if self.pos > self.start {
                    self.emit(Kind::Text);
                }
                self.emit(Kind::Eof);
                return Ok(());
            };
            let delim = self.pos + offset;
            let mut text_end = delim;
            if has_left_trim_marker(&self.input[delim + LEFT.len()..]) {
                while text_end > self.start && is_space(self.input[text_end - 1]) {
                    text_end -= 1;
                }
            }
            if text_end > self.start {
                self.pos = text_end;
                self.emit(Kind::Text);
            }
            self.start = delim;
            self.pos = delim + LEFT.len();
            let trim = has_left_trim_marker(self.rest());
            let after_marker = if trim { 2 } else { 0 };
            if self.input[self.pos + after_marker..].starts_with(b"/*") {
                self.pos += after_marker;
                self.start = self.pos;
                self.comment()?;
                continue;
            }
            self.emit(Kind::LeftDelim);
            self.pos += after_marker;
            self.start = self.pos;
            self.paren_depth = 0;
            self.inside_action()?;
        }
    }

    fn comment(&mut self) -> Result<(), LexError> {
        self.pos += 2;
        let Some(close) = find(self.rest(), b"*/") else {
            return self.error("unclosed comment");
        };
        self.pos += close + 2;
        let (delim, trim) = self.at_right_delim();
        if !delim {
            return self.error("comment ends before closing delimiter");
        }
        if trim {
            self.pos += 2;
        }
        self.pos += RIGHT.len();
        if trim {
            self.skip_leading_space();
        }
        self.start = self.pos;
        Ok(())
    }

    fn skip_leading_space(&mut self) {
        while self.byte_at(self.pos).is_some_and(is_space) {
            self.pos += 1;
        }
    }

    fn right_delim(&mut self) {
        let trim = has_right_trim_marker(self.rest());
        if trim {
            self.pos += 2;
            self.start = self.pos;
        }
        self.pos += RIGHT.len();
        self.emit(Kind::RightDelim);
        if trim {
            self.skip_leading_space();
            self.start = self.pos;
        }
    }

    /// Scans one action, up to and including its closing delimiter.
    fn inside_action(&mut self) -> Result<(), LexError> {
        loop {
            let (delim, _) = self.at_right_delim();
            if delim {
                if self.paren_depth == 0 {
                    self.right_delim();
                    return Ok(());
                }
                return self.error("unclosed left paren");
            }
            let Some(byte) = self.byte_at(self.pos) else {
                return self.error("unclosed action");
            };
            if is_space(byte) {
                if self.space() {
                    self.right_delim();
                    return Ok(());
                }
                continue;
            }
            self.pos += 1;
            match byte {
                b'=' => self.emit(Kind::Assign),
                b':' => {
                    if self.byte_at(self.pos) != Some(b'=') {
                        return self.error("expected :=");
                    }
                    self.pos += 1;
                    self.emit(Kind::Declare);
                }
                b'|' => self.emit(Kind::Pipe),
                b'"' => self.quote(b'"', Kind::String, "unterminated quoted string")?,
                b'\'' => {
                    self.quote(b'\'', Kind::CharConstant, "unterminated character constant")?
                }
                b'`' => {
                    let Some(close) = self.rest().iter().position(|&b| b == b'`') else {
                        return self.error("unterminated raw quoted string");
                    };
                    self.pos += close + 1;
                    self.emit(Kind::RawString);
                }
                b'$' => self.field_or_variable(Kind::Variable)?,
                b'.' if !self.byte_at(self.pos).is_some_and(|b| b.is_ascii_digit()) => {
                    self.field_or_variable(Kind::Dot)?;
                }
                b'.' | b'+' | b'-' | b'0'..=b'9' => {
                    self.pos -= 1;
                    self.number()?;
                }
                b'(' => {
                    self.emit(Kind::LeftParen);
                    self.paren_depth += 1;
                }
                b')' => {
                    if self.paren_depth == 0 {
                        return self.error("unexpected right paren");
                    }
                    self.emit(Kind::RightParen);
                    self.paren_depth -= 1;
                }
                _ if is_alphanumeric(byte) => {
                    self.pos -= 1;
                    self.identifier()?;
                }
                0x20..=0x7e => self.emit(Kind::Char),
                0x80.. => {
                    return self.error(
                        "non-ASCII character inside an action (kactivator supports only ASCII names)",
                    );
                }
                _ => {
                    return self.error(format!("unrecognized character in action: U+{byte:04X}"));
                }
            }
        }
    }

    /// Go's `lexSpace`; returns true when the spaces belong to a " -}}" that
    /// directly closes the action.
    fn space(&mut self) -> bool {
        let mut count = 0;
        while self.byte_at(self.pos).is_some_and(is_space) {
            self.pos += 1;
            count += 1;
        }
        let before_last = self.pos - 1;
        let tail = &self.input[before_last..];
        if has_right_trim_marker(tail) && tail[2..].starts_with(RIGHT) {
            self.pos = before_last;
            if count == 1 {
                return true;
            }
        }
        self.emit(Kind::Space);
        false
    }

    fn quote(&mut self, quote: u8, kind: Kind, unterminated: &str) -> Result<(), LexError> {
        loop {
            match self.byte_at(self.pos) {
                Some(b'\\') => {
                    self.pos += 1;
                    match self.byte_at(self.pos) {
                        None | Some(b'\n') => return self.error(unterminated),
                        Some(_) => self.pos += 1,
                    }
                }
                None | Some(b'\n') => return self.error(unterminated),
                Some(byte) => {
                    self.pos += 1;
                    if byte == quote {
                        break;
                    }
                }
            }
        }
        self.emit(kind);
        Ok(())
    }

    /// After a `.` or `$`: a field or variable name, or `.`/`$` alone.
    fn field_or_variable(&mut self, bare: Kind) -> Result<(), LexError> {
        if self.at_terminator() {
            self.emit(bare);
            return Ok(());
        }
        while self.byte_at(self.pos).is_some_and(is_alphanumeric) {
            self.pos += 1;
        }
        if !self.at_terminator() {
            return self.error(self.bad_character());
        }
        self.emit(if bare == Kind::Dot {
            Kind::Field
        } else {
            Kind::Variable
        });
        Ok(())
    }

    fn bad_character(&self) -> String {
        match self.byte_at(self.pos) {
            Some(byte) if byte >= 0x80 => {
                "non-ASCII character in a name (kactivator supports only ASCII names)".to_string()
            }
            Some(byte) => format!("bad character {:?}", char::from(byte)),
            None => "bad character at end of input".to_string(),
        }
    }

    fn identifier(&mut self) -> Result<(), LexError> {
        while self.byte_at(self.pos).is_some_and(is_alphanumeric) {
            self.pos += 1;
        }
        if !self.at_terminator() {
            return self.error(self.bad_character());
        }
        let kind = match &self.input[self.start..self.pos] {
            b"block" => Kind::Block,
            b"break" => Kind::Break,
            b"continue" => Kind::Continue,
            b"define" => Kind::Define,
            b"else" => Kind::Else,
            b"end" => Kind::End,
            b"if" => Kind::If,
            b"range" => Kind::Range,
            b"nil" => Kind::Nil,
            b"template" => Kind::Template,
            b"with" => Kind::With,
            b"true" | b"false" => Kind::Bool,
            _ => Kind::Identifier,
        };
        self.emit(kind);
        Ok(())
    }

    fn accept(&mut self, valid: &[u8]) -> bool {
        match self.byte_at(self.pos) {
            Some(byte) if valid.contains(&byte) => {
                self.pos += 1;
                true
            }
            _ => false,
        }
    }

    fn accept_run(&mut self, valid: &[u8]) {
        while self.accept(valid) {}
    }

    /// Go's `scanNumber`: deliberately loose; the parser validates.
    fn scan_number(&mut self) -> bool {
        const DECIMAL: &[u8] = b"0123456789_";
        self.accept(b"+-");
        let mut digits = DECIMAL;
        if self.accept(b"0") {
            if self.accept(b"xX") {
                digits = b"0123456789abcdefABCDEF_";
            } else if self.accept(b"oO") {
                digits = b"01234567_";
            } else if self.accept(b"bB") {
                digits = b"01_";
            }
        }
        self.accept_run(digits);
        if self.accept(b".") {
            self.accept_run(digits);
        }
        if digits.len() == DECIMAL.len() && self.accept(b"eE") {
            self.accept(b"+-");
            self.accept_run(DECIMAL);
        }
        if digits.len() == 23 && self.accept(b"pP") {
            self.accept(b"+-");
            self.accept_run(DECIMAL);
        }
        self.accept(b"i");
        match self.byte_at(self.pos) {
            Some(byte) if is_alphanumeric(byte) || byte >= 0x80 => {
                self.pos += 1;
                false
            }
            _ => true,
        }
    }

    fn number(&mut self) -> Result<(), LexError> {
        if !self.scan_number() {
            return self.error("bad number syntax");
        }
        if matches!(self.byte_at(self.pos), Some(b'+' | b'-')) {
            if !self.scan_number() || self.input[self.pos - 1] != b'i' {
                return self.error("bad number syntax");
            }
            self.emit(Kind::Complex);
        } else {
            self.emit(Kind::Number);
        }
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
