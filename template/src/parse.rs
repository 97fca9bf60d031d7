//! The parser (the grammar of Go's `text/template/parse`: `itemList`,
//! `action`, `pipeline`, `command`, `operand`, `term`) and the type checker
//! that resolves every field, variable and function against the request-log
//! data model and produces the tree that `exec` runs.

use std::collections::BTreeSet;

use super::gofmt::Spec;
use super::input::HeadersRead;
use super::lex::{self, Kind, Token};
use super::url::canonical_header_key;

/// A parsed and type-checked request-log template. Immutable, so one value
/// can be shared by all request-handling threads.
#[derive(Debug)]
pub struct Template {
    pub(crate) nodes: Vec<Node>,
    pub(crate) slots: usize,
    pub(crate) headers_read: HeadersRead,
}

/// A refusal: byte offset in the template text and message.
pub(super) type ParseError = (usize, String);
type Result<T> = std::result::Result<T, ParseError>;

/// The static type of a value. Everything in the request-log data has a
/// fixed type; only `and`/`or` over differently typed arguments produce a
/// value whose type is known at run time only (`Mixed`, a set of the others).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Ty {
    Root,
    Request,
    Response,
    Revision,
    Url,
    Header,
    List,
    Str,
    Int,
    Byte,
    Float,
    Bool,
    Nil,
    Mixed(u16),
}

const SIMPLE_TYPES: [Ty; 13] = [
    Ty::Root,
    Ty::Request,
    Ty::Response,
    Ty::Revision,
    Ty::Url,
    Ty::Header,
    Ty::List,
    Ty::Str,
    Ty::Int,
    Ty::Byte,
    Ty::Float,
    Ty::Bool,
    Ty::Nil,
];

impl Ty {
    fn bits(self) -> u16 {
        match self {
            Ty::Mixed(bits) => bits,
            simple => 1 << SIMPLE_TYPES.iter().position(|&t| t == simple).unwrap_or(0),
        }
    }

    fn union(self, other: Ty) -> Ty {
        let bits = self.bits() | other.bits();
        match SIMPLE_TYPES.iter().find(|t| t.bits() == bits) {
            Some(&simple) => simple,
            None => Ty::Mixed(bits),
        }
    }

    /// Whether every possible type of this value is in `allowed`.
    fn within(self, allowed: &[Ty]) -> bool {
        let allowed_bits = allowed.iter().fold(0, |bits, t| bits | t.bits());
        self.bits() & !allowed_bits == 0
    }

    fn includes(self, member: Ty) -> bool {
        self.bits() & member.bits() != 0
    }

    fn name(self) -> &'static str {
        match self {
            Ty::Root => "the template data (*RequestLogTemplateInput)",
            Ty::Request => "*http.Request",
            Ty::Response => "*RequestLogResponse",
            Ty::Revision => "*RequestLogRevision",
            Ty::Url => "*url.URL",
            Ty::Header => "http.Header",
            Ty::List => "[]string",
            Ty::Str => "string",
            Ty::Int => "int",
            Ty::Byte => "uint8",
            Ty::Float => "float64",
            Ty::Bool => "bool",
            Ty::Nil => "nil",
            Ty::Mixed(_) => "a value whose type depends on the request (from and/or)",
        }
    }
}

const SCALARS: [Ty; 6] = [Ty::Str, Ty::Int, Ty::Byte, Ty::Float, Ty::Bool, Ty::Nil];
const PRINTABLE: [Ty; 11] = [
    Ty::Response,
    Ty::Revision,
    Ty::Url,
    Ty::Header,
    Ty::List,
    Ty::Str,
    Ty::Int,
    Ty::Byte,
    Ty::Float,
    Ty::Bool,
    Ty::Nil,
];

/// One node of the executable tree.
#[derive(Debug)]
pub(super) enum Node {
    Text(Box<[u8]>),
    /// `{{pipeline}}`; printed unless it declares or assigns a variable.
    Action(Pipeline),
    If(Pipeline, Vec<Node>, Vec<Node>),
    With(Pipeline, Vec<Node>, Vec<Node>),
    /// The pipeline's declarations are `[element]` or `[index, element]`.
    Range(Pipeline, Vec<Node>, Vec<Node>),
    Break,
    Continue,
}

/// What a pipeline does with its value besides producing it.
#[derive(Debug)]
pub(super) enum Target {
    None,
    /// Pushes the value into these variable slots.
    Declare(Vec<usize>),
    /// Overwrites this variable slot.
    Assign(usize),
}

/// `command | command | ...`; each stage after the first receives the
/// previous value as `Expr::Final`.
#[derive(Debug)]
pub(super) struct Pipeline {
    pub stages: Vec<Expr>,
    pub target: Target,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Func {
    And,
    Or,
    Not,
    Len,
    Index,
    Slice,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Js,
    Html,
    UrlQuery,
    Print,
    Println,
}

/// Fields and argument-less methods of the data model.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Field {
    Request,
    Response,
    Revision,
    TraceId,
    Method,
    RequestUri,
    Proto,
    ProtoMajor,
    ProtoMinor,
    ContentLength,
    Host,
    RemoteAddr,
    Header,
    Url,
    UserAgent,
    Referer,
    Code,
    Size,
    Latency,
    Name,
    Namespace,
    Service,
    Configuration,
    PodName,
    PodIp,
    Scheme,
    Opaque,
    UrlHost,
    Path,
    RawPath,
    RawQuery,
    Fragment,
    RawFragment,
    ForceQuery,
    OmitHost,
    UrlString,
    EscapedPath,
    UrlRequestUri,
    Hostname,
    Port,
    IsAbs,
}

/// A piece of a `printf` format.
#[derive(Debug)]
pub(super) enum Piece {
    Text(Box<[u8]>),
    Verb(Spec),
}

/// An expression of the executable tree.
#[derive(Debug)]
pub(super) enum Expr {
    Str(Box<[u8]>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    Dot,
    /// The value of the previous pipeline stage.
    Final,
    Var(usize),
    Field(Box<Expr>, Field),
    /// `Header.Get` (first value) or `Header.Values`/`index` (all values);
    /// `canonicalize` when the key still needs `CanonicalMIMEHeaderKey`.
    HeaderLookup {
        header: Box<Expr>,
        key: Box<Expr>,
        canonicalize: bool,
        first_only: bool,
    },
    Call(Func, Vec<Expr>),
    Printf(Vec<Piece>, Vec<Expr>),
    Pipe(Box<Pipeline>),
}

struct Typed {
    expr: Expr,
    ty: Ty,
}

#[derive(Debug)]
enum Term {
    Identifier(String),
    Dot,
    Nil,
    Variable(String, Vec<String>),
    Field(Vec<String>),
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Vec<u8>),
    Pipe(Box<PipeAst>),
    Chain(Box<Operand>, Vec<String>),
}

#[derive(Debug)]
struct Operand {
    term: Term,
    pos: usize,
}

#[derive(Debug)]
struct PipeAst {
    pos: usize,
    decls: Vec<(String, usize)>,
    is_assign: bool,
    commands: Vec<Vec<Operand>>,
}

struct Variable {
    name: String,
    ty: Ty,
}

enum Ending {
    End,
    Else { pos: usize, then: Option<Kind> },
}

struct Parser<'t> {
    text: &'t str,
    tokens: Vec<Token>,
    index: usize,
    vars: Vec<Variable>,
    slots: usize,
    range_depth: usize,
    header_names: BTreeSet<String>,
    all_headers: bool,
}

const BUILTINS: [&str; 19] = [
    "and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf",
    "println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne",
];

/// Parses and type-checks a template whose text already ends in a newline.
pub(super) fn parse(text: &str) -> Result<Template> {
    let tokens = lex::lex(text)?;
    let mut parser = Parser {
        text,
        tokens,
        index: 0,
        vars: vec![Variable {
            name: "$".to_string(),
            ty: Ty::Root,
        }],
        slots: 1,
        range_depth: 0,
        header_names: BTreeSet::new(),
        all_headers: false,
    };
    let mut nodes = Vec::new();
    while parser.peek().kind != Kind::Eof {
        if parser.peek().kind == Kind::LeftDelim {
            let delim = parser.index;
            parser.next();
            let keyword = parser.next_non_space();
            if keyword.kind == Kind::Define {
                return Err((keyword.start, unsupported("define", "")));
            }
            parser.index = delim;
        }
        match parser.text_or_action(Ty::Root)? {
            Ok(node) => nodes.push(node),
            Err(Ending::End) => return Err((parser.previous_start(), "unexpected {{end}}".into())),
            Err(Ending::Else { pos, .. }) => return Err((pos, "unexpected {{else}}".into())),
        }
    }
    let headers_read = if parser.all_headers {
        HeadersRead::All
    } else if parser.header_names.is_empty() {
        HeadersRead::None
    } else {
        if parser.header_names.contains("Cache-Control") {
            parser.header_names.insert("Pragma".to_string());
        }
        HeadersRead::Names(parser.header_names.into_iter().collect())
    };
    Ok(Template {
        nodes,
        slots: parser.slots,
        headers_read,
    })
}

fn unsupported(what: &str, hint: &str) -> String {
    format!("{what} is not supported by kactivator's request log templates{hint}")
}

impl Parser<'_> {
    fn peek(&self) -> Token {
        self.tokens[self.index.min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let token = self.peek();
        self.index += 1;
        token
    }

    fn next_non_space(&mut self) -> Token {
        loop {
            let token = self.next();
            if token.kind != Kind::Space {
                return token;
            }
        }
    }

    fn peek_non_space(&mut self) -> Token {
        let saved = self.index;
        let token = self.next_non_space();
        self.index = saved;
        token
    }

    fn previous_start(&self) -> usize {
        self.tokens[self.index.saturating_sub(1).min(self.tokens.len() - 1)].start
    }

    fn token_text(&self, token: Token) -> &str {
        self.text.get(token.start..token.end).unwrap_or("")
    }

    fn unexpected<T>(&self, token: Token, context: &str) -> Result<T> {
        let what = match token.kind {
            Kind::Eof => "end of template".to_string(),
            Kind::RightDelim => "}}".to_string(),
            _ => format!("{:?}", self.token_text(token)),
        };
        Err((token.start, format!("unexpected {what} in {context}")))
    }

    fn expect_right_delim(&mut self, context: &str) -> Result<()> {
        let token = self.next_non_space();
        if token.kind != Kind::RightDelim {
            return self.unexpected(token, context);
        }
        Ok(())
    }

    /// `itemList`: nodes up to `{{end}}` or `{{else}}`.
    fn item_list(&mut self, dot: Ty) -> Result<(Vec<Node>, Ending)> {
        let mut nodes = Vec::new();
        while self.peek_non_space().kind != Kind::Eof {
            match self.text_or_action(dot)? {
                Ok(node) => nodes.push(node),
                Err(ending) => return Ok((nodes, ending)),
            }
        }
        Err((
            self.text.len(),
            "unexpected end of template: missing {{end}}".into(),
        ))
    }

    fn text_or_action(&mut self, dot: Ty) -> Result<std::result::Result<Node, Ending>> {
        let token = self.next_non_space();
        match token.kind {
            Kind::Text => Ok(Ok(Node::Text(
                self.text.as_bytes()[token.start..token.end].into(),
            ))),
            Kind::LeftDelim => self.action(dot),
            _ => self.unexpected(token, "input"),
        }
    }

    fn action(&mut self, dot: Ty) -> Result<std::result::Result<Node, Ending>> {
        let token = self.next_non_space();
        match token.kind {
            Kind::Block => Err((token.start, unsupported("block", ""))),
            Kind::Template => Err((token.start, unsupported("template", ""))),
            Kind::Break | Kind::Continue => {
                let word = self.token_text(token).to_string();
                self.expect_right_delim(&format!("{{{{{word}}}}}"))?;
                if self.range_depth == 0 {
                    return Err((token.start, format!("{{{{{word}}}}} outside {{{{range}}}}")));
                }
                Ok(Ok(if token.kind == Kind::Break {
                    Node::Break
                } else {
                    Node::Continue
                }))
            }
            Kind::Else => {
                let peek = self.peek_non_space();
                if matches!(peek.kind, Kind::If | Kind::With) {
                    return Ok(Err(Ending::Else {
                        pos: token.start,
                        then: Some(peek.kind),
                    }));
                }
                self.expect_right_delim("else")?;
                Ok(Err(Ending::Else {
                    pos: token.start,
                    then: None,
                }))
            }
            Kind::End => {
                self.expect_right_delim("end")?;
                Ok(Err(Ending::End))
            }
            Kind::If | Kind::With | Kind::Range => Ok(Ok(self.control(token.kind, dot)?)),
            _ => {
                self.index -= 1;
                let ast = self.pipeline("command", Kind::RightDelim)?;
                let (pipeline, _) = self.check_statement(ast, dot, true)?;
                Ok(Ok(Node::Action(pipeline)))
            }
        }
    }

    /// `parseControl` for `if`, `with` and `range`.
    fn control(&mut self, kind: Kind, dot: Ty) -> Result<Node> {
        let context = match kind {
            Kind::If => "if",
            Kind::With => "with",
            _ => "range",
        };
        let mark = self.vars.len();
        let ast = self.pipeline(context, Kind::RightDelim)?;
        let (pipeline, body_dot, collection) = if kind == Kind::Range {
            self.check_range(ast, dot)?
        } else {
            let (pipeline, ty) = self.check_statement(ast, dot, false)?;
            self.consume(ty);
            (pipeline, if kind == Kind::With { ty } else { dot }, ty)
        };
        let declared = self.vars.len();
        if kind == Kind::Range {
            self.range_depth += 1;
        }
        let (then, ending) = self.item_list(body_dot)?;
        if kind == Kind::Range {
            self.range_depth -= 1;
        }
        // Variables declared in the body end with it (at run time they exist
        // only on the path that declared them). In a range's else branch the
        // range variables still hold the (empty) collection, as in Go.
        self.vars.truncate(declared);
        if kind == Kind::Range {
            for var in &mut self.vars[mark..] {
                var.ty = collection;
            }
        }
        let otherwise = match ending {
            Ending::End => Vec::new(),
            Ending::Else {
                then: Some(next), ..
            } if next == kind && kind != Kind::Range => {
                self.next_non_space();
                vec![self.control(next, dot)?]
            }
            Ending::Else {
                pos,
                then: Some(next),
            } => {
                let word = if next == Kind::If { "if" } else { "with" };
                return Err((
                    pos,
                    format!("{{{{else {word}}}}} cannot continue a {{{{{context}}}}}"),
                ));
            }
            Ending::Else { then: None, .. } => {
                let (otherwise, ending) = self.item_list(dot)?;
                if let Ending::Else { pos, .. } = ending {
                    return Err((pos, "expected {{end}}; found {{else}}".into()));
                }
                otherwise
            }
        };
        self.vars.truncate(mark);
        Ok(match kind {
            Kind::If => Node::If(pipeline, then, otherwise),
            Kind::With => Node::With(pipeline, then, otherwise),
            _ => Node::Range(pipeline, then, otherwise),
        })
    }

    /// `pipeline`: declarations, then commands separated by `|`.
    fn pipeline(&mut self, context: &str, end: Kind) -> Result<PipeAst> {
        let pos = self.peek_non_space().start;
        let mut ast = PipeAst {
            pos,
            decls: Vec::new(),
            is_assign: false,
            commands: Vec::new(),
        };
        loop {
            let variable = self.peek_non_space();
            if variable.kind != Kind::Variable {
                break;
            }
            let before = self.index;
            self.next_non_space();
            let after = self.peek_non_space();
            match after.kind {
                Kind::Assign | Kind::Declare => {
                    ast.is_assign = after.kind == Kind::Assign;
                    self.next_non_space();
                    ast.decls
                        .push((self.token_text(variable).to_string(), variable.start));
                    break;
                }
                Kind::Char if self.token_text(after) == "," => {
                    self.next_non_space();
                    ast.decls
                        .push((self.token_text(variable).to_string(), variable.start));
                    if context == "range" && ast.decls.len() < 2 {
                        let following = self.peek_non_space();
                        if matches!(
                            following.kind,
                            Kind::Variable | Kind::RightDelim | Kind::RightParen
                        ) {
                            continue;
                        }
                        return Err((
                            following.start,
                            "range can only initialize variables".into(),
                        ));
                    }
                    return Err((after.start, format!("too many declarations in {context}")));
                }
                _ => {
                    self.index = before;
                    break;
                }
            }
        }
        loop {
            let token = self.next_non_space();
            if token.kind == end {
                break;
            }
            match token.kind {
                Kind::Bool
                | Kind::CharConstant
                | Kind::Complex
                | Kind::Dot
                | Kind::Field
                | Kind::Identifier
                | Kind::Number
                | Kind::Nil
                | Kind::RawString
                | Kind::String
                | Kind::Variable
                | Kind::LeftParen => {
                    self.index -= 1;
                    let command = self.command()?;
                    ast.commands.push(command);
                }
                _ => return self.unexpected(token, context),
            }
        }
        if ast.commands.is_empty() {
            return Err((pos, format!("missing value for {context}")));
        }
        for (stage, command) in ast.commands.iter().enumerate().skip(1) {
            if matches!(
                command[0].term,
                Term::Bool(_)
                    | Term::Dot
                    | Term::Nil
                    | Term::Int(_)
                    | Term::Float(_)
                    | Term::Str(_)
            ) {
                return Err((
                    command[0].pos,
                    format!("non executable command in pipeline stage {}", stage + 1),
                ));
            }
        }
        Ok(ast)
    }

    fn command(&mut self) -> Result<Vec<Operand>> {
        let mut operands = Vec::new();
        loop {
            self.peek_non_space();
            if let Some(operand) = self.operand()? {
                operands.push(operand);
            }
            let token = self.next();
            match token.kind {
                Kind::Space => continue,
                Kind::RightDelim | Kind::RightParen => self.index -= 1,
                Kind::Pipe => {}
                _ => return self.unexpected(token, "operand"),
            }
            break;
        }
        if operands.is_empty() {
            return Err((self.previous_start(), "empty command".into()));
        }
        Ok(operands)
    }

    fn operand(&mut self) -> Result<Option<Operand>> {
        let Some(operand) = self.term()? else {
            return Ok(None);
        };
        if self.peek().kind != Kind::Field {
            return Ok(Some(operand));
        }
        let mut fields = Vec::new();
        while self.peek().kind == Kind::Field {
            let token = self.next();
            fields.push(self.token_text(token)[1..].to_string());
        }
        let pos = operand.pos;
        let term = match operand.term {
            Term::Field(mut path) => {
                path.extend(fields);
                Term::Field(path)
            }
            Term::Variable(name, mut path) => {
                path.extend(fields);
                Term::Variable(name, path)
            }
            Term::Bool(_)
            | Term::Str(_)
            | Term::Int(_)
            | Term::Float(_)
            | Term::Nil
            | Term::Dot => {
                return Err((pos, "unexpected . after term".into()));
            }
            other => Term::Chain(Box::new(Operand { term: other, pos }), fields),
        };
        Ok(Some(Operand { term, pos }))
    }

    fn term(&mut self) -> Result<Option<Operand>> {
        let token = self.next_non_space();
        let pos = token.start;
        let text = self.token_text(token);
        let term = match token.kind {
            Kind::Identifier => {
                if !BUILTINS.contains(&text) {
                    return Err((pos, format!("function {text:?} not defined")));
                }
                Term::Identifier(text.to_string())
            }
            Kind::Dot => Term::Dot,
            Kind::Nil => Term::Nil,
            Kind::Variable => {
                if !self.vars.iter().any(|v| v.name == text) {
                    return Err((pos, format!("undefined variable {text:?}")));
                }
                Term::Variable(text.to_string(), Vec::new())
            }
            Kind::Field => Term::Field(vec![text[1..].to_string()]),
            Kind::Bool => Term::Bool(text == "true"),
            Kind::Number => parse_number(text).map_err(|message| (pos, message))?,
            Kind::CharConstant => {
                let (rune, _, rest) = unquote_char(&text.as_bytes()[1..], b'\'')
                    .ok_or((pos, format!("malformed character constant: {text}")))?;
                if rest != b"'" {
                    return Err((pos, format!("malformed character constant: {text}")));
                }
                Term::Int(i64::from(rune))
            }
            Kind::Complex => {
                return Err((pos, unsupported("a complex number", "")));
            }
            Kind::LeftParen => {
                let ast = self.pipeline("parenthesized pipeline", Kind::RightParen)?;
                Term::Pipe(Box::new(ast))
            }
            Kind::String => Term::Str(
                unquote(text.as_bytes()).ok_or((pos, format!("invalid string literal {text}")))?,
            ),
            Kind::RawString => Term::Str(
                text.as_bytes()[1..text.len() - 1]
                    .iter()
                    .copied()
                    .filter(|&b| b != b'\r')
                    .collect(),
            ),
            _ => {
                self.index -= 1;
                return Ok(None);
            }
        };
        Ok(Some(Operand { term, pos }))
    }

    // ---- type checking ----

    fn consume(&mut self, ty: Ty) {
        if ty.includes(Ty::Header) {
            self.all_headers = true;
        }
    }

    fn note_header(&mut self, key: &[u8]) {
        match std::str::from_utf8(key) {
            Ok(name) if !name.is_empty() => {
                self.header_names.insert(name.to_string());
            }
            Ok(_) => {}
            Err(_) => self.all_headers = true,
        }
    }

    fn declare(&mut self, name: String, ty: Ty) -> usize {
        self.vars.push(Variable { name, ty });
        self.slots = self.slots.max(self.vars.len());
        self.vars.len() - 1
    }

    fn find_var(&self, name: &str) -> Option<usize> {
        self.vars.iter().rposition(|v| v.name == name)
    }

    /// An action's or `if`/`with` pipeline, with its declaration or
    /// assignment applied; returns the pipeline and the type of its value.
    fn check_statement(&mut self, ast: PipeAst, dot: Ty, print: bool) -> Result<(Pipeline, Ty)> {
        let (stages, ty) = self.check_stages(&ast, dot)?;
        let target = match ast.decls.first() {
            None if !print => Target::None,
            None => {
                self.consume(ty);
                if !ty.within(&PRINTABLE) {
                    return Err((ast.pos, cannot_print(ty)));
                }
                Target::None
            }
            Some((name, pos)) if ast.is_assign => {
                let slot = self
                    .find_var(name)
                    .ok_or((*pos, format!("undefined variable {name:?}")))?;
                if self.vars[slot].ty != ty {
                    return Err((
                        *pos,
                        format!(
                            "{name} holds {} but is assigned {}; kactivator needs a variable to keep one type",
                            self.vars[slot].ty.name(),
                            ty.name()
                        ),
                    ));
                }
                Target::Assign(slot)
            }
            Some((name, _)) => Target::Declare(vec![self.declare(name.clone(), ty)]),
        };
        Ok((Pipeline { stages, target }, ty))
    }

    fn check_range(&mut self, ast: PipeAst, dot: Ty) -> Result<(Pipeline, Ty, Ty)> {
        let (stages, ty) = self.check_stages(&ast, dot)?;
        let (index_ty, element_ty) = match ty {
            Ty::List => (Ty::Int, Ty::Str),
            Ty::Header => {
                self.consume(ty);
                (Ty::Str, Ty::List)
            }
            _ => {
                return Err((
                    ast.pos,
                    format!(
                        "range over {} is not supported (only []string and http.Header)",
                        ty.name()
                    ),
                ));
            }
        };
        if ast.is_assign {
            return Err((
                ast.pos,
                unsupported("assigning range variables with =", "; use :="),
            ));
        }
        let mut slots = Vec::new();
        let count = ast.decls.len();
        for (position, (name, _)) in ast.decls.into_iter().enumerate() {
            let var_ty = if count == 2 && position == 0 {
                index_ty
            } else {
                element_ty
            };
            slots.push(self.declare(name, var_ty));
        }
        let target = if slots.is_empty() {
            Target::None
        } else {
            Target::Declare(slots)
        };
        Ok((Pipeline { stages, target }, element_ty, ty))
    }

    fn check_stages(&mut self, ast: &PipeAst, dot: Ty) -> Result<(Vec<Expr>, Ty)> {
        let mut stages = Vec::new();
        let mut final_ty = None;
        for command in &ast.commands {
            let typed = self.check_command(command, dot, final_ty)?;
            final_ty = Some(typed.ty);
            stages.push(typed.expr);
        }
        Ok((stages, final_ty.unwrap_or(Ty::Nil)))
    }

    fn check_command(
        &mut self,
        command: &[Operand],
        dot: Ty,
        final_ty: Option<Ty>,
    ) -> Result<Typed> {
        let head = &command[0];
        let rest = &command[1..];
        let has_args = !rest.is_empty() || final_ty.is_some();
        match &head.term {
            Term::Identifier(name) => self.check_call(name, head.pos, rest, dot, final_ty),
            Term::Field(path) => self.check_path(
                Typed {
                    expr: Expr::Dot,
                    ty: dot,
                },
                String::new(),
                path,
                head.pos,
                rest,
                dot,
                final_ty,
            ),
            Term::Variable(name, path) if !path.is_empty() => {
                let receiver = self.check_operand(
                    &Operand {
                        term: Term::Variable(name.clone(), Vec::new()),
                        pos: head.pos,
                    },
                    dot,
                )?;
                self.check_path(receiver, name.clone(), path, head.pos, rest, dot, final_ty)
            }
            Term::Chain(base, path) => {
                let receiver = self.check_chain_base(base, dot)?;
                self.check_path(
                    receiver,
                    "(...)".into(),
                    path,
                    head.pos,
                    rest,
                    dot,
                    final_ty,
                )
            }
            Term::Nil => Err((head.pos, "nil is not a command".into())),
            _ if has_args => Err((head.pos, "can't give argument to non-function".into())),
            _ => self.check_operand(head, dot),
        }
    }

    fn check_chain_base(&mut self, base: &Operand, dot: Ty) -> Result<Typed> {
        match base.term {
            Term::Pipe(_) => self.check_operand(base, dot),
            _ => Err((
                base.pos,
                "a field after a function name is not supported; call the function in parentheses"
                    .into(),
            )),
        }
    }

    /// An operand in argument position (Go's `evalArg`).
    fn check_operand(&mut self, operand: &Operand, dot: Ty) -> Result<Typed> {
        let pos = operand.pos;
        let (expr, ty) = match &operand.term {
            Term::Dot => (Expr::Dot, dot),
            Term::Nil => (Expr::Nil, Ty::Nil),
            Term::Bool(value) => (Expr::Bool(*value), Ty::Bool),
            Term::Int(value) => (Expr::Int(*value), Ty::Int),
            Term::Float(value) => (Expr::Float(*value), Ty::Float),
            Term::Str(value) => (Expr::Str(value.clone().into_boxed_slice()), Ty::Str),
            Term::Variable(name, path) => {
                let slot = self
                    .find_var(name)
                    .ok_or((pos, format!("undefined variable {name:?}")))?;
                let var = Typed {
                    expr: Expr::Var(slot),
                    ty: self.vars[slot].ty,
                };
                if path.is_empty() {
                    return Ok(var);
                }
                return self.check_path(var, name.clone(), path, pos, &[], dot, None);
            }
            Term::Field(path) => {
                let receiver = Typed {
                    expr: Expr::Dot,
                    ty: dot,
                };
                return self.check_path(receiver, String::new(), path, pos, &[], dot, None);
            }
            Term::Chain(base, path) => {
                let receiver = self.check_chain_base(base, dot)?;
                return self.check_path(receiver, "(...)".into(), path, pos, &[], dot, None);
            }
            Term::Identifier(name) => return self.check_call(name, pos, &[], dot, None),
            Term::Pipe(ast) => {
                if !ast.decls.is_empty() {
                    return Err((
                        ast.decls[0].1,
                        unsupported("declaring a variable inside parentheses", ""),
                    ));
                }
                let (stages, ty) = self.check_stages(ast, dot)?;
                let pipeline = Pipeline {
                    stages,
                    target: Target::None,
                };
                (Expr::Pipe(Box::new(pipeline)), ty)
            }
        };
        Ok(Typed { expr, ty })
    }

    /// Walks `.A.B.C` from `receiver`; the last name may be a method that
    /// takes `args` (and the pipeline's final value).
    #[allow(clippy::too_many_arguments)]
    fn check_path(
        &mut self,
        mut receiver: Typed,
        mut shown: String,
        path: &[String],
        pos: usize,
        args: &[Operand],
        dot: Ty,
        final_ty: Option<Ty>,
    ) -> Result<Typed> {
        for (position, name) in path.iter().enumerate() {
            let last = position + 1 == path.len();
            if receiver.ty == Ty::Header && (name == "Get" || name == "Values") {
                let mut typed_args = Vec::new();
                if last {
                    for arg in args {
                        typed_args.push(self.check_operand(arg, dot)?);
                    }
                    if let Some(ty) = final_ty {
                        typed_args.push(Typed {
                            expr: Expr::Final,
                            ty,
                        });
                    }
                }
                if typed_args.len() != 1 {
                    return Err((
                        pos,
                        format!(
                            "{shown}.{name} takes one argument, the header name; got {} (write ({shown}.{name} \"Name\"))",
                            typed_args.len()
                        ),
                    ));
                }
                let key = typed_args.remove(0);
                if key.ty != Ty::Str {
                    return Err((
                        pos,
                        format!(
                            "{shown}.{name} needs a string argument, not {}",
                            key.ty.name()
                        ),
                    ));
                }
                let (key, canonicalize) = match key.expr {
                    Expr::Str(literal) => {
                        let canonical = canonical_header_key(&literal).into_owned();
                        self.note_header(&canonical);
                        (Expr::Str(canonical.into_boxed_slice()), false)
                    }
                    other => {
                        self.all_headers = true;
                        (other, true)
                    }
                };
                receiver = Typed {
                    expr: Expr::HeaderLookup {
                        header: Box::new(receiver.expr),
                        key: Box::new(key),
                        canonicalize,
                        first_only: name == "Get",
                    },
                    ty: if name == "Get" { Ty::Str } else { Ty::List },
                };
                shown = format!("{shown}.{name}");
                continue;
            }
            let (field, ty) = resolve_field(receiver.ty, name, &shown).map_err(|m| (pos, m))?;
            match field {
                Field::UserAgent => self.note_header(b"User-Agent"),
                Field::Referer => self.note_header(b"Referer"),
                Field::TraceId => {
                    self.note_header(b"Traceparent");
                    self.note_header(b"X-B3-Traceid");
                }
                _ => {}
            }
            if last && (!args.is_empty() || final_ty.is_some()) {
                return Err((
                    pos,
                    format!("{shown}.{name} is not a method that takes arguments"),
                ));
            }
            receiver = Typed {
                expr: Expr::Field(Box::new(receiver.expr), field),
                ty,
            };
            shown = format!("{shown}.{name}");
        }
        Ok(receiver)
    }

    fn check_call(
        &mut self,
        name: &str,
        pos: usize,
        args: &[Operand],
        dot: Ty,
        final_ty: Option<Ty>,
    ) -> Result<Typed> {
        let mut typed = Vec::new();
        for arg in args {
            typed.push(self.check_operand(arg, dot)?);
        }
        if let Some(ty) = final_ty {
            typed.push(Typed {
                expr: Expr::Final,
                ty,
            });
        }
        let count = typed.len();
        let wrong_count = |wanted: &str| {
            Err((
                pos,
                format!("wrong number of arguments for {name}: want {wanted}, got {count}"),
            ))
        };
        let func = match name {
            "and" | "or" => {
                if count == 0 {
                    return wrong_count("at least 1");
                }
                let ty = typed.iter().fold(typed[0].ty, |ty, arg| ty.union(arg.ty));
                for arg in &typed {
                    self.consume(arg.ty);
                }
                let func = if name == "and" { Func::And } else { Func::Or };
                return Ok(Typed {
                    expr: Expr::Call(func, typed.into_iter().map(|t| t.expr).collect()),
                    ty,
                });
            }
            "not" => {
                if count != 1 {
                    return wrong_count("1");
                }
                self.consume(typed[0].ty);
                return Ok(call(Func::Not, typed, Ty::Bool));
            }
            "len" => {
                if count != 1 {
                    return wrong_count("1");
                }
                let ty = typed[0].ty;
                if !matches!(ty, Ty::Str | Ty::List | Ty::Header) {
                    return Err((pos, format!("len of {} is an error in Go", ty.name())));
                }
                self.consume(ty);
                return Ok(call(Func::Len, typed, Ty::Int));
            }
            "index" => return self.check_index(pos, typed),
            "slice" => {
                if count == 0 {
                    return wrong_count("at least 1");
                }
                if typed[0].ty != Ty::Str {
                    return Err((
                        pos,
                        format!(
                            "slice of {} is not supported (only strings: the capacity of Go's header slices is not predictable)",
                            typed[0].ty.name()
                        ),
                    ));
                }
                if count > 3 {
                    return Err((pos, "slice of a string takes at most 2 indexes".into()));
                }
                check_indexes(pos, &typed[1..])?;
                return Ok(call(Func::Slice, typed, Ty::Str));
            }
            "eq" | "ne" => {
                if name == "eq" && count < 2 {
                    return wrong_count("at least 2");
                }
                if name == "ne" && count != 2 {
                    return wrong_count("2");
                }
                for arg in &typed[1..] {
                    check_equality(pos, name, typed[0].ty, arg.ty)?;
                }
                if name == "eq" {
                    Func::Eq
                } else {
                    Func::Ne
                }
            }
            "lt" | "le" | "gt" | "ge" => {
                if count != 2 {
                    return wrong_count("2");
                }
                check_order(pos, name, typed[0].ty, typed[1].ty)?;
                match name {
                    "lt" => Func::Lt,
                    "le" => Func::Le,
                    "gt" => Func::Gt,
                    _ => Func::Ge,
                }
            }
            "js" | "html" | "urlquery" | "print" | "println" => {
                for arg in &typed {
                    self.consume(arg.ty);
                    if !arg.ty.within(&PRINTABLE) {
                        return Err((pos, format!("{name}: {}", cannot_print(arg.ty))));
                    }
                }
                let func = match name {
                    "js" => Func::Js,
                    "html" => Func::Html,
                    "urlquery" => Func::UrlQuery,
                    "print" => Func::Print,
                    _ => Func::Println,
                };
                return Ok(call(func, typed, Ty::Str));
            }
            "printf" => return self.check_printf(pos, typed),
            _ => {
                return Err((
                    pos,
                    unsupported(
                        &format!("the function {name:?}"),
                        " (the data has no functions to call)",
                    ),
                ));
            }
        };
        Ok(call(func, typed, Ty::Bool))
    }

    fn check_index(&mut self, pos: usize, mut typed: Vec<Typed>) -> Result<Typed> {
        if typed.is_empty() {
            return Err((
                pos,
                "wrong number of arguments for index: want at least 1, got 0".into(),
            ));
        }
        let keys = typed.split_off(1);
        let mut item = typed.remove(0);
        if keys.is_empty() {
            self.consume(item.ty);
        }
        for key in keys {
            item = match item.ty {
                Ty::Header => {
                    if key.ty != Ty::Str {
                        return Err((
                            pos,
                            format!(
                                "index of http.Header needs a string key, not {}",
                                key.ty.name()
                            ),
                        ));
                    }
                    match &key.expr {
                        Expr::Str(literal) if *canonical_header_key(literal) == **literal => {
                            self.note_header(literal)
                        }
                        Expr::Str(_) => {}
                        _ => self.all_headers = true,
                    }
                    Typed {
                        expr: Expr::HeaderLookup {
                            header: Box::new(item.expr),
                            key: Box::new(key.expr),
                            canonicalize: false,
                            first_only: false,
                        },
                        ty: Ty::List,
                    }
                }
                Ty::List | Ty::Str => {
                    check_indexes(pos, std::slice::from_ref(&key))?;
                    let ty = if item.ty == Ty::List {
                        Ty::Str
                    } else {
                        Ty::Byte
                    };
                    Typed {
                        expr: Expr::Call(Func::Index, vec![item.expr, key.expr]),
                        ty,
                    }
                }
                other => {
                    return Err((pos, format!("can't index item of type {}", other.name())));
                }
            };
        }
        Ok(item)
    }

    fn check_printf(&mut self, pos: usize, mut typed: Vec<Typed>) -> Result<Typed> {
        if typed.is_empty() {
            return Err((pos, "printf needs a format".into()));
        }
        let format = typed.remove(0);
        let Expr::Str(format) = format.expr else {
            return Err((
                pos,
                unsupported("printf with a format that is not a string literal", ""),
            ));
        };
        let pieces = parse_format(&format).map_err(|message| (pos, message))?;
        let verbs: Vec<&Spec> = pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Verb(spec) => Some(spec),
                Piece::Text(_) => None,
            })
            .collect();
        if verbs.len() != typed.len() {
            return Err((
                pos,
                format!(
                    "printf format has {} verbs but {} arguments (Go would print %!(EXTRA ...) or %!v(MISSING))",
                    verbs.len(),
                    typed.len()
                ),
            ));
        }
        for (spec, arg) in verbs.iter().zip(&typed) {
            self.consume(arg.ty);
            check_verb(spec, arg.ty).map_err(|message| (pos, message))?;
        }
        Ok(Typed {
            expr: Expr::Printf(pieces, typed.into_iter().map(|t| t.expr).collect()),
            ty: Ty::Str,
        })
    }
}

fn call(func: Func, typed: Vec<Typed>, ty: Ty) -> Typed {
    Typed {
        expr: Expr::Call(func, typed.into_iter().map(|t| t.expr).collect()),
        ty,
    }
}

fn cannot_print(ty: Ty) -> String {
    format!(
        "printing {} is not supported (Go would print memory addresses)",
        ty.name()
    )
}

fn check_indexes(pos: usize, indexes: &[Typed]) -> Result<()> {
    for index in indexes {
        if !matches!(index.ty, Ty::Int | Ty::Byte) {
            return Err((
                pos,
                format!("an index must be an integer, not {}", index.ty.name()),
            ));
        }
    }
    Ok(())
}

const BASIC: [Ty; 5] = [Ty::Str, Ty::Int, Ty::Byte, Ty::Float, Ty::Bool];

fn same_basic_kind(left: Ty, right: Ty) -> bool {
    let integer = |ty| matches!(ty, Ty::Int | Ty::Byte);
    left == right || (integer(left) && integer(right))
}

fn check_equality(pos: usize, name: &str, left: Ty, right: Ty) -> Result<()> {
    let mut allowed = BASIC.to_vec();
    allowed.push(Ty::Nil);
    for ty in [left, right] {
        if !ty.within(&allowed) {
            return Err((
                pos,
                format!(
                    "{name} of {} is not supported (only strings, numbers and booleans)",
                    ty.name()
                ),
            ));
        }
    }
    let comparable = matches!(left, Ty::Mixed(_) | Ty::Nil)
        || matches!(right, Ty::Mixed(_) | Ty::Nil)
        || same_basic_kind(left, right);
    if !comparable {
        return Err((
            pos,
            format!(
                "{name} compares {} with {}, which Go reports as an error when executing",
                left.name(),
                right.name()
            ),
        ));
    }
    Ok(())
}

fn check_order(pos: usize, name: &str, left: Ty, right: Ty) -> Result<()> {
    let ordered = [Ty::Str, Ty::Int, Ty::Byte, Ty::Float];
    for ty in [left, right] {
        if !ty.within(&ordered) {
            return Err((
                pos,
                format!(
                    "{name} of {} is an error in Go (only strings and numbers are ordered)",
                    ty.name()
                ),
            ));
        }
    }
    let comparable = matches!(left, Ty::Mixed(_))
        || matches!(right, Ty::Mixed(_))
        || same_basic_kind(left, right);
    if !comparable {
        return Err((
            pos,
            format!(
                "{name} compares {} with {}, which Go reports as an error when executing",
                left.name(),
                right.name()
            ),
        ));
    }
    Ok(())
}

/// Which fields and argument-less methods each type has.
fn resolve_field(
    receiver: Ty,
    name: &str,
    shown: &str,
) -> std::result::Result<(Field, Ty), String> {
    use Field as F;
    let table: &[(&str, Field, Ty)] = match receiver {
        Ty::Root => &[
            ("Request", F::Request, Ty::Request),
            ("Response", F::Response, Ty::Response),
            ("Revision", F::Revision, Ty::Revision),
            ("TraceID", F::TraceId, Ty::Str),
        ],
        Ty::Request => &[
            ("Method", F::Method, Ty::Str),
            ("RequestURI", F::RequestUri, Ty::Str),
            ("Proto", F::Proto, Ty::Str),
            ("ProtoMajor", F::ProtoMajor, Ty::Int),
            ("ProtoMinor", F::ProtoMinor, Ty::Int),
            ("ContentLength", F::ContentLength, Ty::Int),
            ("Host", F::Host, Ty::Str),
            ("RemoteAddr", F::RemoteAddr, Ty::Str),
            ("Header", F::Header, Ty::Header),
            ("URL", F::Url, Ty::Url),
            ("UserAgent", F::UserAgent, Ty::Str),
            ("Referer", F::Referer, Ty::Str),
        ],
        Ty::Response => &[
            ("Code", F::Code, Ty::Int),
            ("Size", F::Size, Ty::Int),
            ("Latency", F::Latency, Ty::Float),
        ],
        Ty::Revision => &[
            ("Name", F::Name, Ty::Str),
            ("Namespace", F::Namespace, Ty::Str),
            ("Service", F::Service, Ty::Str),
            ("Configuration", F::Configuration, Ty::Str),
            ("PodName", F::PodName, Ty::Str),
            ("PodIP", F::PodIp, Ty::Str),
        ],
        Ty::Url => &[
            ("Scheme", F::Scheme, Ty::Str),
            ("Opaque", F::Opaque, Ty::Str),
            ("Host", F::UrlHost, Ty::Str),
            ("Path", F::Path, Ty::Str),
            ("RawPath", F::RawPath, Ty::Str),
            ("RawQuery", F::RawQuery, Ty::Str),
            ("Fragment", F::Fragment, Ty::Str),
            ("RawFragment", F::RawFragment, Ty::Str),
            ("ForceQuery", F::ForceQuery, Ty::Bool),
            ("OmitHost", F::OmitHost, Ty::Bool),
            ("String", F::UrlString, Ty::Str),
            ("EscapedPath", F::EscapedPath, Ty::Str),
            ("RequestURI", F::UrlRequestUri, Ty::Str),
            ("Hostname", F::Hostname, Ty::Str),
            ("Port", F::Port, Ty::Str),
            ("IsAbs", F::IsAbs, Ty::Bool),
        ],
        Ty::Header => {
            return Err(format!(
                "{shown}.{name}: looking a header up as a field is not supported; write (index {shown} \"{name}\") or ({shown}.Get \"{name}\")"
            ));
        }
        other => {
            return Err(format!(
                "{shown}.{name}: {} has no field or method {name}",
                other.name()
            ));
        }
    };
    if let Some(&(_, field, ty)) = table.iter().find(|(known, _, _)| *known == name) {
        return Ok((field, ty));
    }
    let shown = if shown.is_empty() { "." } else { shown };
    let known: Vec<&str> = table.iter().map(|(known, _, _)| *known).collect();
    Err(format!(
        "unknown or unsupported field {name} of {shown} (known: {})",
        known.join(", ")
    ))
}

/// Go's number literal rules for the forms supported here: decimal, `0x`,
/// `0o`, `0b` and leading-zero octal integers, and decimal floats.
fn parse_number(text: &str) -> std::result::Result<Term, String> {
    let refuse = |what: &str| Err(unsupported(what, "; write the number in plain decimal"));
    if text.contains('_') {
        return refuse("a number with underscores");
    }
    if text.ends_with('i') {
        return refuse("an imaginary number");
    }
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = unsigned.to_ascii_lowercase();
    let (radix, digits) = if let Some(hex) = lower.strip_prefix("0x") {
        if hex.contains(['.', 'p']) {
            return refuse("a hexadecimal float");
        }
        (16, hex)
    } else if lower.contains(['.', 'e']) {
        let value: f64 = text
            .parse()
            .map_err(|_| format!("illegal number syntax: {text:?}"))?;
        if !value.is_finite() {
            return Err(format!("illegal number syntax: {text:?} (out of range)"));
        }
        return Ok(Term::Float(value));
    } else if let Some(octal) = lower.strip_prefix("0o") {
        (8, octal)
    } else if let Some(binary) = lower.strip_prefix("0b") {
        (2, binary)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    let magnitude = u64::from_str_radix(digits, radix)
        .ok()
        .filter(|_| !digits.is_empty() && !digits.starts_with(['+', '-']))
        .ok_or(format!("illegal number syntax: {text:?}"))?;
    let value = if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    };
    value.map(Term::Int).ok_or(format!("{text} overflows int"))
}

/// Go's `strconv.UnquoteChar`: one character or escape from `text`, whether
/// it stands for a rune (rather than a single byte, as `\x` and octal
/// escapes do), and the rest; `None` on a syntax error.
fn unquote_char(text: &[u8], quote: u8) -> Option<(u32, bool, &[u8])> {
    let &first = text.first()?;
    if first == quote && (quote == b'\'' || quote == b'"') {
        return None;
    }
    if first >= 0x80 {
        let (rune, size) = super::gofmt::decode_rune(text);
        return Some((rune, true, &text[size..]));
    }
    if first != b'\\' {
        return Some((u32::from(first), false, &text[1..]));
    }
    let &escape = text.get(1)?;
    let simple = match escape {
        b'a' => Some(7),
        b'b' => Some(8),
        b'f' => Some(12),
        b'n' => Some(10),
        b'r' => Some(13),
        b't' => Some(9),
        b'v' => Some(11),
        b'\\' => Some(u32::from(b'\\')),
        b'\'' | b'"' if escape == quote => Some(u32::from(escape)),
        _ => None,
    };
    if let Some(value) = simple {
        return Some((value, false, &text[2..]));
    }
    let (start, count, radix) = match escape {
        b'x' => (2, 2, 16),
        b'u' => (2, 4, 16),
        b'U' => (2, 8, 16),
        b'0'..=b'7' => (1, 3, 8),
        _ => return None,
    };
    let digits = text.get(start..start + count)?;
    let valid = |byte: &u8| {
        if radix == 8 {
            (b'0'..=b'7').contains(byte)
        } else {
            byte.is_ascii_hexdigit()
        }
    };
    if !digits.iter().all(valid) {
        return None;
    }
    let value = u32::from_str_radix(std::str::from_utf8(digits).ok()?, radix).ok()?;
    let rest = &text[start + count..];
    match escape {
        b'x' => Some((value, false, rest)),
        b'0'..=b'7' if value <= 255 => Some((value, false, rest)),
        b'u' | b'U' if char::from_u32(value).is_some() => Some((value, true, rest)),
        _ => None,
    }
}

/// Go's `strconv.Unquote` of a double-quoted literal (quotes included).
fn unquote(text: &[u8]) -> Option<Vec<u8>> {
    let mut rest = text.get(1..text.len().checked_sub(1)?)?;
    let mut out = Vec::with_capacity(rest.len());
    while !rest.is_empty() {
        let (value, is_rune, after) = unquote_char(rest, b'"')?;
        if is_rune && value >= 0x80 {
            let character = char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER);
            let mut buffer = [0; 4];
            out.extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
        } else {
            out.push(value as u8);
        }
        rest = after;
    }
    Some(out)
}

/// Parses a `printf` format into text and verbs, refusing what this engine
/// does not format exactly as Go's `fmt.Sprintf`.
fn parse_format(format: &[u8]) -> std::result::Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = Vec::new();
    let mut index = 0;
    while index < format.len() {
        if format[index] != b'%' {
            text.push(format[index]);
            index += 1;
            continue;
        }
        index += 1;
        let mut spec = Spec::default();
        while let Some(&flag) = format.get(index) {
            match flag {
                b'0' => spec.zero = !spec.minus,
                b'+' => spec.plus = true,
                b'-' => {
                    spec.minus = true;
                    spec.zero = false;
                }
                b' ' => spec.space = true,
                b'#' => return Err(unsupported("the printf flag #", "")),
                _ => break,
            }
            index += 1;
        }
        let number = |index: &mut usize| -> std::result::Result<Option<usize>, String> {
            let start = *index;
            while format.get(*index).is_some_and(u8::is_ascii_digit) {
                *index += 1;
            }
            if *index == start {
                return Ok(None);
            }
            let value: usize = std::str::from_utf8(&format[start..*index])
                .ok()
                .and_then(|digits| digits.parse().ok())
                .filter(|&value| value <= 1000)
                .ok_or_else(|| unsupported("a printf width or precision above 1000", ""))?;
            Ok(Some(value))
        };
        if matches!(format.get(index), Some(b'*' | b'[')) {
            return Err(unsupported("printf's * and [n] in verbs", ""));
        }
        spec.width = number(&mut index)?;
        if format.get(index) == Some(&b'.') {
            index += 1;
            if matches!(format.get(index), Some(b'*' | b'[')) {
                return Err(unsupported("printf's * and [n] in verbs", ""));
            }
            spec.precision = Some(number(&mut index)?.unwrap_or(0));
        }
        let Some(&verb) = format.get(index) else {
            return Err("printf format ends with an incomplete verb (Go prints %!(NOVERB))".into());
        };
        index += 1;
        if verb == b'%' {
            if spec != Spec::default() {
                return Err(unsupported("flags or width on %%", ""));
            }
            text.push(b'%');
            continue;
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text).into_boxed_slice()));
        }
        spec.verb = verb;
        pieces.push(Piece::Verb(spec));
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text.into_boxed_slice()));
    }
    Ok(pieces)
}

/// Which verb, flag and argument-type combinations are formatted exactly.
fn check_verb(spec: &Spec, ty: Ty) -> std::result::Result<(), String> {
    let verb = char::from(spec.verb);
    let flags_ok = |plus: bool, space: bool, zero: bool| {
        (plus || !spec.plus) && (space || !spec.space) && (zero || !spec.zero)
    };
    let ok = match spec.verb {
        b'v' => {
            ty.within(&PRINTABLE)
                && flags_ok(false, false, false)
                && spec.precision.is_none()
                && (spec.width.is_none() || ty.within(&SCALARS))
        }
        b's' if matches!(ty, Ty::Str | Ty::Url) => flags_ok(false, false, false),
        b's' if matches!(ty, Ty::List | Ty::Header) => {
            *spec
                == Spec {
                    verb: b's',
                    ..Spec::default()
                }
        }
        b'q' if matches!(ty, Ty::Str | Ty::Url) => flags_ok(true, false, false),
        b'd' if matches!(ty, Ty::Int | Ty::Byte) => spec.precision.is_none(),
        b'x' | b'X' if matches!(ty, Ty::Int | Ty::Byte) => spec.precision.is_none(),
        b'x' | b'X' if ty == Ty::Str => flags_ok(false, false, false) && spec.precision.is_none(),
        b'e' | b'E' | b'f' | b'F' | b'g' | b'G' if ty == Ty::Float => true,
        b't' if ty == Ty::Bool => flags_ok(false, false, false) && spec.precision.is_none(),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(unsupported(
        &format!("printf verb %{verb} with these flags for {}", ty.name()),
        " (supported: %v %s %q %d %x %X %e %f %g %t with matching types; - + space 0 flags where Go applies them; width; precision for %s %q %e %f %g)",
    ))
}
