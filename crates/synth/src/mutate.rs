//! Procedural bug injection over tree-sitter syntax trees (SWE-smith's operators, rebuilt).
//!
//! A [`Language`] parses a source file; [`entities`] lists its functions (and, for Python,
//! classes) with their complexity; [`mutate`] applies one [`OperatorId`] to one entity with a
//! seeded RNG and returns the byte-range [`Edit`]s, or `None` when the operator does not apply
//! or the result would not parse. Every candidate is a pure function of (source, entity,
//! operator, seed), so a task can be regenerated bit for bit from its metadata.

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tree_sitter::{Node, Parser, Tree};

/// A source language the operators understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python (`tree-sitter-python`).
    Python,
    /// Rust (`tree-sitter-rust`).
    Rust,
    /// Go (`tree-sitter-go`).
    Go,
    /// JavaScript, JSX included (`tree-sitter-javascript`): `.js`, `.mjs`, `.cjs`, `.jsx`.
    #[serde(rename = "javascript")]
    JavaScript,
    /// TypeScript (`tree-sitter-typescript`'s TypeScript grammar): `.ts`, `.mts`, `.cts`
    /// (`.d.ts` declaration files have no code to mutate and are left out).
    #[serde(rename = "typescript")]
    TypeScript,
}

impl Language {
    /// The language of a file, by extension.
    pub fn of_path(path: &str) -> Option<Language> {
        if path.ends_with(".py") {
            Some(Language::Python)
        } else if path.ends_with(".rs") {
            Some(Language::Rust)
        } else if path.ends_with(".go") {
            Some(Language::Go)
        } else if [".js", ".mjs", ".cjs", ".jsx"].iter().any(|e| path.ends_with(e)) {
            Some(Language::JavaScript)
        } else if [".ts", ".mts", ".cts"].iter().any(|e| path.ends_with(e)) && !path.ends_with(".d.ts") {
            Some(Language::TypeScript)
        } else {
            None
        }
    }

    /// Parses `source`; `None` only if tree-sitter gives up entirely.
    pub fn parse(self, source: &str) -> Option<Tree> {
        let mut parser = Parser::new();
        parser.set_language(&self.grammar()).ok()?;
        parser.parse(source, None)
    }

    /// The tree-sitter grammar.
    fn grammar(self) -> tree_sitter::Language {
        match self {
            Language::Python => tree_sitter_python::LANGUAGE.into(),
            Language::Rust => tree_sitter_rust::LANGUAGE.into(),
            Language::Go => tree_sitter_go::LANGUAGE.into(),
            Language::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Language::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
        }
    }

    /// Whether the language is JavaScript or TypeScript (one grammar family: the same node
    /// kinds for everything the operators touch).
    pub fn is_js_family(self) -> bool {
        matches!(self, Language::JavaScript | Language::TypeScript)
    }

    /// Whether `source` parses without syntax errors.
    pub fn parses_cleanly(self, source: &str) -> bool {
        self.parse(source).is_some_and(|t| !t.root_node().has_error())
    }
}

/// The procedural operators (SWE-smith strategy ids in [`OperatorId::strategy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorId {
    /// Replace a binary operator by another of its family.
    OpChange,
    /// Swap the operands of a binary, boolean or comparison operation.
    OpSwap,
    /// In `a op (b op c)` drop one sub-operand.
    OpBreakChains,
    /// Integer literal operand ±1.
    OpChangeConst,
    /// Flip an operator through a fixed table (`==`↔`!=`, `<`↔`>`, `and`↔`or`, `True`↔`False`, …).
    OpFlip,
    /// Swap the bodies of an `if` with a plain `else`.
    CtrlInvertIf,
    /// Shuffle the top-level statements of a function body.
    CtrlShuffle,
    /// Delete a loop.
    RemoveLoop,
    /// Delete an `if`.
    RemoveCond,
    /// Delete an assignment.
    RemoveAssign,
    /// Delete a `with` / `try` wrapper (Python).
    RemoveWrapper,
    /// Remove a base class (Python).
    ClassRmBase,
    /// Reorder the methods of a class (Python).
    ClassShuffleFuncs,
    /// Remove a method of a class (Python).
    ClassRmFuncs,
}

/// Every operator, in table order.
pub const ALL_OPERATORS: &[OperatorId] = &[
    OperatorId::OpChange,
    OperatorId::OpSwap,
    OperatorId::OpBreakChains,
    OperatorId::OpChangeConst,
    OperatorId::OpFlip,
    OperatorId::CtrlInvertIf,
    OperatorId::CtrlShuffle,
    OperatorId::RemoveLoop,
    OperatorId::RemoveCond,
    OperatorId::RemoveAssign,
    OperatorId::RemoveWrapper,
    OperatorId::ClassRmBase,
    OperatorId::ClassShuffleFuncs,
    OperatorId::ClassRmFuncs,
];

/// Operators named on the command line (`op_change,remove_loop,…`; strategy ids work too):
/// `None` for an empty list (every operator of the language), an error naming an unknown name
/// and listing the known ones.
pub fn parse_operator_names(names: &[String]) -> anyhow::Result<Option<Vec<OperatorId>>> {
    if names.is_empty() {
        return Ok(None);
    }
    names
        .iter()
        .map(|n| {
            OperatorId::parse(n.trim()).ok_or_else(|| {
                let known: Vec<&str> = ALL_OPERATORS.iter().map(|o| o.short_name()).collect();
                anyhow::anyhow!("unknown operator {n:?}; known: {}", known.join(", "))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

impl OperatorId {
    /// SWE-smith's strategy id (`func_pm_op_change`, …).
    pub fn strategy(self) -> &'static str {
        match self {
            OperatorId::OpChange => "func_pm_op_change",
            OperatorId::OpSwap => "func_pm_op_swap",
            OperatorId::OpBreakChains => "func_pm_op_break_chains",
            OperatorId::OpChangeConst => "func_pm_op_change_const",
            OperatorId::OpFlip => "func_pm_flip_operators",
            OperatorId::CtrlInvertIf => "func_pm_ctrl_invert_if",
            OperatorId::CtrlShuffle => "func_pm_ctrl_shuffle",
            OperatorId::RemoveLoop => "func_pm_remove_loop",
            OperatorId::RemoveCond => "func_pm_remove_cond",
            OperatorId::RemoveAssign => "func_pm_remove_assign",
            OperatorId::RemoveWrapper => "func_pm_remove_wrapper",
            OperatorId::ClassRmBase => "func_pm_class_rm_base",
            OperatorId::ClassShuffleFuncs => "func_pm_class_shuffle_funcs",
            OperatorId::ClassRmFuncs => "func_pm_class_rm_funcs",
        }
    }

    /// The short snake-case name (`op_change`): the strategy id without `func_pm_`.
    pub fn short_name(self) -> &'static str {
        self.strategy().trim_start_matches("func_pm_")
    }

    /// Parses a strategy id or the short snake-case name (`op_change`).
    pub fn parse(name: &str) -> Option<OperatorId> {
        ALL_OPERATORS.iter().copied().find(|o| {
            let s = o.strategy();
            s == name || o.short_name() == name
        })
    }

    /// Whether the operator removes or reorders code (the "strong" operators the frontier
    /// controller prefers when tasks are too easy).
    pub fn is_strong(self) -> bool {
        !matches!(
            self,
            OperatorId::OpChange
                | OperatorId::OpSwap
                | OperatorId::OpChangeConst
                | OperatorId::OpFlip
                | OperatorId::OpBreakChains
        )
    }

    /// Whether the operator works on classes rather than functions.
    pub fn is_class_level(self) -> bool {
        matches!(self, OperatorId::ClassRmBase | OperatorId::ClassShuffleFuncs | OperatorId::ClassRmFuncs)
    }
}

/// One row of a language's operator table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OperatorSpec {
    /// The operator.
    pub id: OperatorId,
    /// Chance that each eligible site fires in one pass.
    pub likelihood: f64,
    /// Smallest entity complexity the operator is tried on.
    pub min_complexity: u32,
    /// Largest entity complexity the operator is tried on.
    pub max_complexity: u32,
}

/// The operator table of a language (SWE-smith's likelihoods and gates; `min_complexity`
/// is the global minimum unless the operator asks for more).
pub fn operator_table(lang: Language, min_complexity: u32) -> Vec<OperatorSpec> {
    let row = |id, likelihood, min: u32, max| OperatorSpec {
        id,
        likelihood,
        min_complexity: min.max(min_complexity),
        max_complexity: max,
    };
    let mut table = vec![
        row(OperatorId::OpChange, 0.4, 0, u32::MAX),
        row(OperatorId::OpSwap, 0.4, 0, u32::MAX),
        row(OperatorId::OpBreakChains, 0.4, 0, u32::MAX),
        row(OperatorId::OpChangeConst, 0.4, 0, u32::MAX),
        row(OperatorId::OpFlip, 0.4, 0, u32::MAX),
        row(OperatorId::CtrlInvertIf, 0.25, 5, u32::MAX),
        row(OperatorId::CtrlShuffle, 0.25, 0, 10),
        row(OperatorId::RemoveLoop, 0.25, 0, u32::MAX),
        row(OperatorId::RemoveCond, 0.25, 0, u32::MAX),
        row(OperatorId::RemoveAssign, 0.25, 0, u32::MAX),
    ];
    if lang == Language::Python {
        table.push(row(OperatorId::RemoveWrapper, 0.25, 0, u32::MAX));
        table.push(row(OperatorId::ClassRmBase, 0.25, 10, u32::MAX));
        table.push(row(OperatorId::ClassShuffleFuncs, 0.25, 10, u32::MAX));
        table.push(row(OperatorId::ClassRmFuncs, 0.15, 10, u32::MAX));
    }
    table
}

/// What kind of code unit an entity is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntityKind {
    /// A function or method.
    Function,
    /// A class (Python).
    Class,
}

/// A function or class the operators may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    /// Function or class name (methods as `Class.method`).
    pub name: String,
    /// Function or class.
    pub kind: EntityKind,
    /// Byte range in the source.
    pub start_byte: usize,
    /// End of the byte range.
    pub end_byte: usize,
    /// 1-based first line.
    pub line: usize,
    /// 1 + branches, loops, extra boolean operands, exception handlers.
    pub complexity: u32,
}

/// A replacement of `source[start..end]` by `text`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Edit {
    /// First byte replaced.
    pub start: usize,
    /// One past the last byte replaced.
    pub end: usize,
    /// Replacement text.
    pub text: String,
}

/// Applies non-overlapping edits to `source` (any order given).
pub fn apply_edits(source: &str, edits: &[Edit]) -> Option<String> {
    let mut sorted: Vec<&Edit> = edits.iter().collect();
    sorted.sort_by_key(|e| (e.start, e.end));
    let mut out = String::with_capacity(source.len());
    let mut pos = 0;
    for e in sorted {
        if e.start < pos || e.end > source.len() || e.start > e.end {
            return None;
        }
        out.push_str(source.get(pos..e.start)?);
        out.push_str(&e.text);
        pos = e.end;
    }
    out.push_str(source.get(pos..)?);
    Some(out)
}

/// Whether two edit lists touch overlapping or adjacent byte ranges.
pub fn edits_overlap(a: &[Edit], b: &[Edit]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.start <= y.end && y.start <= x.end))
}

fn text<'a>(node: Node, src: &'a str) -> &'a str {
    &src[node.byte_range()]
}

fn descendants<'t>(node: Node<'t>) -> Vec<Node<'t>> {
    let mut out = Vec::new();
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        out.push(n);
        let mut c = n.walk();
        let children: Vec<Node> = n.children(&mut c).collect();
        stack.extend(children.into_iter().rev());
    }
    out
}

fn is_test_only_rust(node: Node, src: &str) -> bool {
    // `#[test]` / `#[cfg(test)]` on the item or an enclosing `mod`.
    let mut cur = Some(node);
    while let Some(n) = cur {
        if matches!(n.kind(), "function_item" | "mod_item") {
            let mut prev = n.prev_named_sibling();
            while let Some(p) = prev.filter(|p| p.kind() == "attribute_item") {
                let t = text(p, src);
                if t.contains("test") {
                    return true;
                }
                prev = p.prev_named_sibling();
            }
            if n.kind() == "mod_item" && n.child_by_field_name("name").is_some_and(|m| text(m, src) == "tests") {
                return true;
            }
        }
        cur = n.parent();
    }
    false
}

fn complexity(lang: Language, node: Node, src: &str) -> u32 {
    let mut c = 1;
    for n in descendants(node) {
        c += match (lang, n.kind()) {
            (Language::Python, "if_statement" | "elif_clause" | "for_statement" | "while_statement")
            | (Language::Python, "except_clause" | "conditional_expression" | "for_in_clause")
            | (Language::Python, "boolean_operator") => 1,
            (Language::Rust, "if_expression" | "for_expression" | "while_expression" | "loop_expression")
            | (Language::Rust, "match_arm" | "try_expression") => 1,
            (Language::Go, "if_statement" | "for_statement" | "expression_case" | "type_case")
            | (Language::Go, "communication_case") => 1,
            (Language::JavaScript | Language::TypeScript, "if_statement" | "for_statement" | "for_in_statement")
            | (Language::JavaScript | Language::TypeScript, "while_statement" | "do_statement" | "switch_case")
            | (Language::JavaScript | Language::TypeScript, "catch_clause" | "ternary_expression") => 1,
            (_, "binary_expression") => {
                let op = n.child_by_field_name("operator").map(|o| text(o, src)).unwrap_or("");
                u32::from(op == "&&" || op == "||" || op == "??")
            }
            _ => 0,
        };
    }
    c
}

/// The receiver type of a Go method (`func (s *Stack) Push` → `Stack`).
fn go_receiver_type(method: Node, src: &str) -> Option<String> {
    let recv = method.child_by_field_name("receiver")?;
    let param = recv.named_child(0)?;
    let ty = text(param.child_by_field_name("type")?, src);
    // `*Stack[T]` → `Stack`.
    let ty = ty.trim_start_matches('*');
    Some(ty.split('[').next().unwrap_or(ty).trim().to_string())
}

/// The name a JavaScript/TypeScript function expression or arrow function is known by: the
/// variable, object key or assignment target it is bound to (`None` for an anonymous
/// callback, which is not an entity).
fn js_bound_name(node: Node, src: &str) -> Option<String> {
    if let Some(n) = node.child_by_field_name("name") {
        return Some(text(n, src).to_string());
    }
    let parent = node.parent()?;
    let target = match parent.kind() {
        "variable_declarator" => parent.child_by_field_name("name")?,
        "pair" => parent.child_by_field_name("key")?,
        "assignment_expression" => parent.child_by_field_name("left")?,
        "public_field_definition" | "field_definition" => {
            parent.child_by_field_name("name").or_else(|| parent.child_by_field_name("property"))?
        }
        _ => return None,
    };
    Some(text(target, src).to_string())
}

fn qualified_name(node: Node, src: &str, lang: Language) -> String {
    let own = if lang.is_js_family() {
        js_bound_name(node, src).unwrap_or_default()
    } else {
        node.child_by_field_name("name").map(|n| text(n, src).to_string()).unwrap_or_default()
    };
    let mut parts = vec![own];
    if lang == Language::Go && node.kind() == "method_declaration" {
        if let Some(t) = go_receiver_type(node, src) {
            parts.push(t);
        }
    }
    let mut cur = node.parent();
    while let Some(p) = cur {
        let name = match (lang, p.kind()) {
            (Language::Python, "class_definition" | "function_definition") => {
                p.child_by_field_name("name").map(|n| text(n, src).to_string())
            }
            (Language::Rust, "impl_item") => p.child_by_field_name("type").map(|n| text(n, src).to_string()),
            (Language::Rust, "function_item") => p.child_by_field_name("name").map(|n| text(n, src).to_string()),
            (Language::Go, "function_declaration" | "method_declaration") => {
                p.child_by_field_name("name").map(|n| text(n, src).to_string())
            }
            (
                Language::JavaScript | Language::TypeScript,
                "class_declaration" | "class" | "abstract_class_declaration",
            ) => p.child_by_field_name("name").map(|n| text(n, src).to_string()),
            (Language::JavaScript | Language::TypeScript, "function_declaration" | "method_definition") => {
                p.child_by_field_name("name").map(|n| text(n, src).to_string())
            }
            _ => None,
        };
        if let Some(n) = name {
            parts.push(n);
        }
        cur = p.parent();
    }
    parts.reverse();
    parts.join(".")
}

/// The functions (and Python classes) of `source`, in source order; test-only Rust items
/// (`#[test]`, `#[cfg(test)]`, `mod tests`) are left out. Go: functions and methods (not
/// function literals). JavaScript/TypeScript: function declarations, methods, and function
/// expressions or arrow functions bound to a name (`const f = () => …`, `{ f: function () … }`,
/// `exports.f = …`); anonymous callbacks are part of the function that contains them.
pub fn entities(lang: Language, source: &str) -> Vec<Entity> {
    lang.parse(source).map_or_else(Vec::new, |tree| entities_of(lang, &tree, source))
}

/// [`entities`] of `source` as parsed into `tree`.
fn entities_of(lang: Language, tree: &Tree, source: &str) -> Vec<Entity> {
    let mut out = Vec::new();
    for n in descendants(tree.root_node()) {
        let kind = match (lang, n.kind()) {
            (Language::Python, "function_definition") | (Language::Rust, "function_item") => EntityKind::Function,
            (Language::Go, "function_declaration" | "method_declaration") => EntityKind::Function,
            (
                Language::JavaScript | Language::TypeScript,
                "function_declaration" | "generator_function_declaration",
            )
            | (Language::JavaScript | Language::TypeScript, "method_definition") => EntityKind::Function,
            (Language::JavaScript | Language::TypeScript, "function_expression" | "arrow_function" | "function")
                if js_bound_name(n, source).is_some() =>
            {
                EntityKind::Function
            }
            (Language::Python, "class_definition") => EntityKind::Class,
            _ => continue,
        };
        if n.has_error() || (lang == Language::Rust && is_test_only_rust(n, source)) {
            continue;
        }
        // Declarations without a body (Rust trait items, TypeScript overload signatures).
        if lang != Language::Python && n.child_by_field_name("body").is_none() {
            continue;
        }
        out.push(Entity {
            name: qualified_name(n, source, lang),
            kind,
            start_byte: n.start_byte(),
            end_byte: n.end_byte(),
            line: n.start_position().row + 1,
            complexity: complexity(lang, n, source),
        });
    }
    out
}

/// A candidate site: the edits one firing of the operator makes.
type Site = Vec<Edit>;

fn edit(node: Node, text: impl Into<String>) -> Edit {
    Edit { start: node.start_byte(), end: node.end_byte(), text: text.into() }
}

fn binary_kinds(lang: Language) -> &'static [&'static str] {
    match lang {
        Language::Python => &["binary_operator", "boolean_operator"],
        Language::Rust | Language::Go | Language::JavaScript | Language::TypeScript => &["binary_expression"],
    }
}

fn change_family(lang: Language, op: &str) -> &'static [&'static str] {
    const PY: &[&[&str]] = &[&["+", "-"], &["*", "/", "//", "%"], &["&", "|", "^"], &["<<", ">>"], &["**", "*"]];
    const RS: &[&[&str]] =
        &[&["+", "-", "*", "/", "%"], &["&", "|", "^", "<<", ">>"], &["==", "!=", "<", "<=", ">", ">="], &["&&", "||"]];
    const GO: &[&[&str]] = &[
        &["+", "-", "*", "/", "%"],
        &["&", "|", "^", "<<", ">>", "&^"],
        &["==", "!=", "<", "<=", ">", ">="],
        &["&&", "||"],
    ];
    const JS: &[&[&str]] = &[
        &["+", "-", "*", "/", "%"],
        &["&", "|", "^", "<<", ">>", ">>>"],
        &["===", "!==", "<", "<=", ">", ">="],
        &["==", "!="],
        &["&&", "||"],
    ];
    let table = match lang {
        Language::Python => PY,
        Language::Rust => RS,
        Language::Go => GO,
        Language::JavaScript | Language::TypeScript => JS,
    };
    table.iter().find(|f| f.contains(&op)).copied().unwrap_or(&[])
}

fn flip(lang: Language, op: &str) -> Option<&'static str> {
    Some(match (lang, op) {
        (_, "+") => "-",
        (_, "-") => "+",
        (_, "*") => "/",
        (_, "/") => "*",
        (_, "==") => "!=",
        (_, "!=") => "==",
        (_, "<") => ">",
        (_, ">") => "<",
        (_, "<=") => ">=",
        (_, ">=") => "<=",
        (_, "<<") => ">>",
        (_, ">>") => "<<",
        (Language::Python, "//") => "%",
        (Language::Python, "%") => "//",
        (Language::Python, "**") => "*",
        (Language::Python, "in") => "not in",
        (Language::Python, "not in") => "in",
        (Language::Python, "is") => "is not",
        (Language::Python, "is not") => "is",
        (Language::Python, "and") => "or",
        (Language::Python, "or") => "and",
        (Language::Python, "True") => "False",
        (Language::Python, "False") => "True",
        (Language::Rust, "%") => "*",
        (Language::Rust, "&") => "|",
        (Language::Rust, "|") => "&",
        (Language::Rust, "^") => "&",
        (Language::Rust, "&&") => "||",
        (Language::Rust, "||") => "&&",
        (Language::Rust, "true") => "false",
        (Language::Rust, "false") => "true",
        (Language::Go, "%") => "*",
        (Language::Go, "&") => "|",
        (Language::Go, "|") => "&",
        (Language::Go, "^" | "&^") => "&",
        (Language::Go, "&&") => "||",
        (Language::Go, "||") => "&&",
        (Language::Go, "true") => "false",
        (Language::Go, "false") => "true",
        (Language::JavaScript | Language::TypeScript, "===") => "!==",
        (Language::JavaScript | Language::TypeScript, "!==") => "===",
        (Language::JavaScript | Language::TypeScript, "%") => "*",
        (Language::JavaScript | Language::TypeScript, "&") => "|",
        (Language::JavaScript | Language::TypeScript, "|") => "&",
        (Language::JavaScript | Language::TypeScript, "^") => "&",
        (Language::JavaScript | Language::TypeScript, ">>>") => "<<",
        (Language::JavaScript | Language::TypeScript, "&&") => "||",
        (Language::JavaScript | Language::TypeScript, "||") => "&&",
        (Language::JavaScript | Language::TypeScript, "true") => "false",
        (Language::JavaScript | Language::TypeScript, "false") => "true",
        _ => return None,
    })
}

/// The operator tokens of a binary/comparison node (Python comparisons have several).
fn operator_tokens<'t>(lang: Language, n: Node<'t>) -> Vec<Node<'t>> {
    if lang == Language::Python && n.kind() == "comparison_operator" {
        let mut c = n.walk();
        return n.children(&mut c).filter(|ch| !ch.is_named()).collect();
    }
    n.child_by_field_name("operator").into_iter().collect()
}

fn unwrap_parens(n: Node) -> Node {
    if n.kind() == "parenthesized_expression" && n.named_child_count() == 1 {
        if let Some(inner) = n.named_child(0) {
            return inner;
        }
    }
    n
}

fn line_start(src: &str, byte: usize) -> usize {
    src[..byte].rfind('\n').map_or(0, |i| i + 1)
}

/// Deletes a statement: its whole lines when it stands alone on them; in Python a block left
/// empty gets `pass`.
fn delete_statement(lang: Language, node: Node, src: &str) -> Edit {
    let ls = line_start(src, node.start_byte());
    let alone_start = src[ls..node.start_byte()].trim().is_empty();
    let le = src[node.end_byte()..].find('\n').map_or(src.len(), |i| node.end_byte() + i + 1);
    let alone_end = src[node.end_byte()..le].trim().is_empty();
    let only_child =
        lang == Language::Python && node.parent().is_some_and(|p| p.kind() == "block" && p.named_child_count() == 1);
    if only_child {
        return edit(node, "pass");
    }
    if alone_start && alone_end {
        Edit { start: ls, end: le, text: String::new() }
    } else {
        edit(node, "")
    }
}

fn python_statement_of<'t>(n: Node<'t>, kinds: &[&str]) -> Option<Node<'t>> {
    if kinds.contains(&n.kind()) {
        return Some(n);
    }
    None
}

fn sites(lang: Language, op: OperatorId, entity: Node, src: &str, rng: &mut StdRng) -> Vec<Site> {
    let nodes = descendants(entity);
    let mut out: Vec<Site> = Vec::new();
    match op {
        OperatorId::OpChange => {
            for n in &nodes {
                if !binary_kinds(lang).contains(&n.kind()) && n.kind() != "comparison_operator" {
                    continue;
                }
                for tok in operator_tokens(lang, *n) {
                    let family: Vec<&str> =
                        change_family(lang, text(tok, src)).iter().copied().filter(|o| *o != text(tok, src)).collect();
                    if let Some(new) = family.choose(rng) {
                        out.push(vec![edit(tok, *new)]);
                    }
                }
            }
        }
        OperatorId::OpFlip => {
            for n in &nodes {
                if binary_kinds(lang).contains(&n.kind()) || n.kind() == "comparison_operator" {
                    for tok in operator_tokens(lang, *n) {
                        if let Some(new) = flip(lang, text(tok, src)) {
                            out.push(vec![edit(tok, new)]);
                        }
                    }
                } else if matches!(n.kind(), "true" | "false" | "boolean_literal") {
                    if let Some(new) = flip(lang, text(*n, src)) {
                        out.push(vec![edit(*n, new)]);
                    }
                } else if lang == Language::Python && n.kind() == "not_operator" {
                    if let Some(arg) = n.child_by_field_name("argument") {
                        out.push(vec![edit(*n, text(arg, src))]);
                    }
                } else if lang != Language::Python
                    && n.kind() == "unary_expression"
                    && text(*n, src).starts_with('!')
                    && !text(*n, src).starts_with("!=")
                {
                    if let Some(arg) = n.named_child(0) {
                        out.push(vec![edit(*n, text(arg, src))]);
                    }
                }
            }
        }
        OperatorId::OpSwap => {
            for n in &nodes {
                let pair = if binary_kinds(lang).contains(&n.kind()) {
                    n.child_by_field_name("left").zip(n.child_by_field_name("right"))
                } else if lang == Language::Python && n.kind() == "comparison_operator" && n.named_child_count() == 2 {
                    n.named_child(0).zip(n.named_child(1))
                } else {
                    None
                };
                if let Some((l, r)) = pair {
                    if text(l, src) != text(r, src) {
                        out.push(vec![edit(l, text(r, src)), edit(r, text(l, src))]);
                    }
                }
            }
        }
        OperatorId::OpBreakChains => {
            for n in &nodes {
                if !binary_kinds(lang).contains(&n.kind()) {
                    continue;
                }
                let (Some(l), Some(r)) = (n.child_by_field_name("left"), n.child_by_field_name("right")) else {
                    continue;
                };
                let (li, ri) = (unwrap_parens(l), unwrap_parens(r));
                if binary_kinds(lang).contains(&li.kind()) {
                    if let Some(ll) = li.child_by_field_name("left") {
                        out.push(vec![edit(l, text(ll, src))]);
                    }
                } else if binary_kinds(lang).contains(&ri.kind()) {
                    if let Some(rr) = ri.child_by_field_name("right") {
                        out.push(vec![edit(r, text(rr, src))]);
                    }
                }
            }
        }
        OperatorId::OpChangeConst => {
            for n in &nodes {
                let is_int = matches!(n.kind(), "integer" | "integer_literal" | "int_literal" | "number");
                let in_binop = n
                    .parent()
                    .is_some_and(|p| binary_kinds(lang).contains(&p.kind()) || p.kind() == "comparison_operator");
                if is_int && in_binop {
                    if let Some(new) = bump_integer(text(*n, src), rng) {
                        out.push(vec![edit(*n, new)]);
                    }
                }
            }
        }
        OperatorId::CtrlInvertIf => {
            for n in &nodes {
                let swap = match (lang, n.kind()) {
                    (Language::Python, "if_statement") => {
                        let mut c = n.walk();
                        let alts: Vec<Node> = n.children_by_field_name("alternative", &mut c).collect();
                        match (n.child_by_field_name("consequence"), alts.as_slice()) {
                            (Some(cons), [alt]) if alt.kind() == "else_clause" => {
                                alt.child_by_field_name("body").map(|b| (cons, b))
                            }
                            _ => None,
                        }
                    }
                    (Language::Rust, "if_expression") => {
                        let cons = n.child_by_field_name("consequence");
                        let alt = n.child_by_field_name("alternative").and_then(|a| a.named_child(0));
                        cons.zip(alt.filter(|a| a.kind() == "block"))
                    }
                    (Language::Go, "if_statement") => {
                        let cons = n.child_by_field_name("consequence");
                        let alt = n.child_by_field_name("alternative");
                        cons.zip(alt.filter(|a| a.kind() == "block"))
                    }
                    (Language::JavaScript | Language::TypeScript, "if_statement") => {
                        let cons = n.child_by_field_name("consequence").filter(|c| c.kind() == "statement_block");
                        let alt = n
                            .child_by_field_name("alternative")
                            .and_then(|a| a.named_child(0))
                            .filter(|a| a.kind() == "statement_block");
                        cons.zip(alt)
                    }
                    _ => None,
                };
                if let Some((a, b)) = swap {
                    if text(a, src) != text(b, src) {
                        out.push(vec![edit(a, text(b, src)), edit(b, text(a, src))]);
                    }
                }
            }
        }
        OperatorId::CtrlShuffle => {
            // The statements' container: Go wraps a block's statements in a statement_list; an
            // arrow function with an expression body has no statements to shuffle.
            let body = entity.child_by_field_name("body").and_then(|b| match lang {
                Language::Go => b.named_child(0).filter(|l| l.kind() == "statement_list"),
                Language::JavaScript | Language::TypeScript => Some(b).filter(|b| b.kind() == "statement_block"),
                _ => Some(b),
            });
            if let Some(body) = body {
                let mut c = body.walk();
                let mut stmts: Vec<Node> = body.named_children(&mut c).filter(|s| s.kind() != "comment").collect();
                if lang == Language::Rust {
                    // The tail expression gives the block its value: it stays last.
                    if stmts
                        .last()
                        .is_some_and(|s| !s.kind().ends_with("statement") && !s.kind().ends_with("declaration"))
                    {
                        stmts.pop();
                    }
                }
                if lang == Language::Python
                    && stmts.first().is_some_and(|s| {
                        s.kind() == "expression_statement" && s.named_child(0).is_some_and(|e| e.kind() == "string")
                    })
                {
                    stmts.remove(0);
                }
                if stmts.len() >= 2 {
                    let texts: Vec<&str> = stmts.iter().map(|s| text(*s, src)).collect();
                    let mut order: Vec<usize> = (0..texts.len()).collect();
                    for _ in 0..5 {
                        order.shuffle(rng);
                        if order.iter().enumerate().any(|(i, &j)| texts[i] != texts[j]) {
                            break;
                        }
                    }
                    out.push(stmts.iter().zip(&order).map(|(s, &j)| edit(*s, texts[j])).collect());
                }
            }
        }
        OperatorId::RemoveLoop | OperatorId::RemoveCond | OperatorId::RemoveAssign | OperatorId::RemoveWrapper => {
            let kinds: &[&str] = match (lang, op) {
                (Language::Python, OperatorId::RemoveLoop) => &["for_statement", "while_statement"],
                (Language::Python, OperatorId::RemoveCond) => &["if_statement"],
                (Language::Python, OperatorId::RemoveAssign) => &["assignment", "augmented_assignment"],
                (Language::Python, OperatorId::RemoveWrapper) => &["with_statement", "try_statement"],
                (Language::Rust, OperatorId::RemoveLoop) => &["for_expression", "while_expression", "loop_expression"],
                (Language::Rust, OperatorId::RemoveCond) => &["if_expression"],
                (Language::Rust, OperatorId::RemoveAssign) => {
                    &["let_declaration", "assignment_expression", "compound_assignment_expr"]
                }
                (Language::Go, OperatorId::RemoveLoop) => &["for_statement"],
                (Language::Go, OperatorId::RemoveCond) => &["if_statement"],
                (Language::Go, OperatorId::RemoveAssign) => {
                    &["assignment_statement", "short_var_declaration", "inc_statement", "dec_statement"]
                }
                (Language::JavaScript | Language::TypeScript, OperatorId::RemoveLoop) => {
                    &["for_statement", "for_in_statement", "while_statement", "do_statement"]
                }
                (Language::JavaScript | Language::TypeScript, OperatorId::RemoveCond) => &["if_statement"],
                (Language::JavaScript | Language::TypeScript, OperatorId::RemoveAssign) => &[
                    "assignment_expression",
                    "augmented_assignment_expression",
                    "lexical_declaration",
                    "variable_declaration",
                ],
                _ => &[],
            };
            for n in &nodes {
                let Some(found) = python_statement_of(*n, kinds) else { continue };
                // The statement to delete: Python assignments sit in an expression_statement,
                // Rust expressions in an expression_statement; a Rust `let` is one itself.
                let stmt = match found.parent() {
                    Some(p) if p.kind() == "expression_statement" => p,
                    _ => found,
                };
                let in_block = stmt.parent().is_some_and(|p| {
                    matches!(p.kind(), "block" | "module" | "statement_list" | "statement_block" | "program")
                });
                if !in_block || stmt.id() == entity.id() {
                    continue;
                }
                if lang == Language::Rust && stmt.kind() != "expression_statement" && stmt.kind() != "let_declaration" {
                    continue;
                }
                // A JavaScript assignment is deleted only as a whole statement, never out of a
                // `for (…; …; i += 1)` header or a larger expression.
                if lang.is_js_family()
                    && op == OperatorId::RemoveAssign
                    && stmt.kind() != "expression_statement"
                    && !stmt.kind().ends_with("declaration")
                {
                    continue;
                }
                out.push(vec![delete_statement(lang, stmt, src)]);
            }
        }
        OperatorId::ClassRmBase => {
            if let Some(args) = entity.child_by_field_name("superclasses") {
                let mut c = args.walk();
                let bases: Vec<Node> = args.named_children(&mut c).collect();
                let positional: Vec<Node> = bases.iter().copied().filter(|b| b.kind() != "keyword_argument").collect();
                if positional.len() == bases.len() && !positional.is_empty() {
                    out.push(vec![edit(args, "")]);
                } else if let Some(b) = positional.first() {
                    // Remove the base and the comma that follows it.
                    let mut end = b.end_byte();
                    let rest = &src[end..];
                    if let Some(i) = rest.find(',') {
                        end += i + 1;
                        end += src[end..].len() - src[end..].trim_start().len();
                    }
                    out.push(vec![Edit { start: b.start_byte(), end, text: String::new() }]);
                }
            }
        }
        OperatorId::ClassShuffleFuncs | OperatorId::ClassRmFuncs => {
            if let Some(body) = entity.child_by_field_name("body") {
                let mut c = body.walk();
                let methods: Vec<Node> = body
                    .named_children(&mut c)
                    .filter(|m| matches!(m.kind(), "function_definition" | "decorated_definition"))
                    .collect();
                if op == OperatorId::ClassRmFuncs {
                    for m in &methods {
                        out.push(vec![delete_statement(lang, *m, src)]);
                    }
                } else if methods.len() >= 2 {
                    let texts: Vec<&str> = methods.iter().map(|m| text(*m, src)).collect();
                    let mut order: Vec<usize> = (0..texts.len()).collect();
                    for _ in 0..5 {
                        order.shuffle(rng);
                        if order.iter().enumerate().any(|(i, &j)| i != j) {
                            break;
                        }
                    }
                    out.push(methods.iter().zip(&order).map(|(m, &j)| edit(*m, texts[j])).collect());
                }
            }
        }
    }
    out
}

fn bump_integer(lit: &str, rng: &mut StdRng) -> Option<String> {
    let delta: i128 = if rng.random_bool(0.5) { 1 } else { -1 };
    let (digits, suffix) = match lit.find(|c: char| c.is_ascii_alphabetic() && !lit.starts_with("0x")) {
        Some(i) if !lit.starts_with("0x") && !lit.starts_with("0X") => (&lit[..i], &lit[i..]),
        _ => (lit, ""),
    };
    let value = if let Some(hex) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        let v = i128::from_str_radix(&hex.replace('_', ""), 16).ok()?;
        let nv = (v + delta).max(0);
        return Some(format!("0x{nv:x}{suffix}"));
    } else {
        digits.replace('_', "").parse::<i128>().ok()?
    };
    let mut nv = value + delta;
    if nv < 0 {
        nv = value + 1;
    }
    Some(format!("{nv}{suffix}"))
}

/// A seeded RNG for one (seed, file, entity, operator) candidate: the same inputs give the
/// same stream on every machine.
pub fn candidate_rng(seed: u64, file: &str, entity: &Entity, op: OperatorId) -> StdRng {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(file.as_bytes());
    h.update([0]);
    h.update(entity.name.as_bytes());
    h.update(entity.start_byte.to_le_bytes());
    h.update(op.strategy().as_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(&digest);
    StdRng::from_seed(bytes)
}

/// Applies `spec` to `entity` of `source`: each eligible site fires with the operator's
/// likelihood, up to 5 passes until something fires. Returns the edits, or `None` when
/// the operator has no site, nothing changed, or the result has a syntax error. To try
/// many entities and operators on one file, parse it once with [`ParsedSource`].
pub fn mutate(
    lang: Language,
    source: &str,
    entity: &Entity,
    spec: &OperatorSpec,
    rng: &mut StdRng,
) -> Option<Vec<Edit>> {
    ParsedSource::new(lang, source)?.mutate(entity, spec, rng)
}

/// One source file parsed once, for trying every (entity, operator) pair on it: a mutation's
/// result is checked by tree-sitter's incremental parse, which re-reads only what the edits
/// touched. Parsing the whole file twice a pair made candidate generation quadratic in file
/// size: 2-3 minutes of a debug build for Jinja2 2.11.3's 13K lines, most of it in the parser.
pub struct ParsedSource<'s> {
    lang: Language,
    source: &'s str,
    tree: Tree,
    parser: Parser,
    /// Byte offset where each line starts (tree-sitter's edits take row/column points).
    line_starts: Vec<usize>,
}

impl<'s> ParsedSource<'s> {
    /// Parses `source`; `None` only if tree-sitter gives up entirely.
    pub fn new(lang: Language, source: &'s str) -> Option<ParsedSource<'s>> {
        let mut parser = Parser::new();
        parser.set_language(&lang.grammar()).ok()?;
        let tree = parser.parse(source, None)?;
        let line_starts = std::iter::once(0).chain(source.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Some(ParsedSource { lang, source, tree, parser, line_starts })
    }

    /// [`entities`] of this file, from its tree.
    pub fn entities(&self) -> Vec<Entity> {
        entities_of(self.lang, &self.tree, self.source)
    }

    /// [`mutate`] on this file.
    pub fn mutate(&mut self, entity: &Entity, spec: &OperatorSpec, rng: &mut StdRng) -> Option<Vec<Edit>> {
        if entity.complexity < spec.min_complexity || entity.complexity > spec.max_complexity {
            return None;
        }
        if spec.id.is_class_level() != (entity.kind == EntityKind::Class) {
            return None;
        }
        let (lang, source) = (self.lang, self.source);
        let node = self.tree.root_node().descendant_for_byte_range(entity.start_byte, entity.end_byte)?;
        let node = find_entity_node(node, entity)?;
        let all = sites(lang, spec.id, node, source, rng);
        if all.is_empty() {
            return None;
        }
        for _ in 0..5 {
            let mut chosen: Vec<Edit> = Vec::new();
            for site in &all {
                if rng.random_bool(spec.likelihood) && !edits_overlap(&chosen, site) {
                    chosen.extend(site.iter().cloned());
                }
            }
            if chosen.is_empty() {
                continue;
            }
            let mutated = apply_edits(source, &chosen)?;
            if mutated == source || !self.parses_cleanly_after(&chosen, &mutated) {
                return None;
            }
            return Some(chosen);
        }
        None
    }

    /// Whether `mutated` (this file with `edits` applied) parses without syntax errors, by an
    /// incremental parse from this file's tree.
    fn parses_cleanly_after(&mut self, edits: &[Edit], mutated: &str) -> bool {
        let mut tree = self.tree.clone();
        let mut sorted: Vec<&Edit> = edits.iter().collect();
        // Last edit first: the offsets and points of the ones before it stay those of `source`.
        sorted.sort_by_key(|e| std::cmp::Reverse(e.start));
        for e in sorted {
            let start_position = self.point_at(e.start);
            tree.edit(&tree_sitter::InputEdit {
                start_byte: e.start,
                old_end_byte: e.end,
                new_end_byte: e.start + e.text.len(),
                start_position,
                old_end_position: self.point_at(e.end),
                new_end_position: point_after(start_position, &e.text),
            });
        }
        self.parser.parse(mutated, Some(&tree)).is_some_and(|t| !t.root_node().has_error())
    }

    /// The row and byte column of `byte` in the source.
    fn point_at(&self, byte: usize) -> tree_sitter::Point {
        let row = self.line_starts.partition_point(|&start| start <= byte) - 1;
        tree_sitter::Point { row, column: byte - self.line_starts[row] }
    }
}

/// Where `text` ends when written at `start`.
fn point_after(start: tree_sitter::Point, text: &str) -> tree_sitter::Point {
    match text.rfind('\n') {
        Some(last) => tree_sitter::Point { row: start.row + text.matches('\n').count(), column: text.len() - last - 1 },
        None => tree_sitter::Point { row: start.row, column: start.column + text.len() },
    }
}

fn find_entity_node<'t>(mut node: Node<'t>, entity: &Entity) -> Option<Node<'t>> {
    loop {
        if node.start_byte() == entity.start_byte && node.end_byte() == entity.end_byte {
            return Some(node);
        }
        node = node.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PY: &str = "def clamp(values, lo, hi):\n    out = []\n    for v in values:\n        if v < lo:\n            out.append(lo)\n        elif v > hi:\n            out.append(hi)\n        else:\n            out.append(v + 0 * 2)\n    return out\n\n\ndef pick(flag, a, b):\n    if flag and a:\n        r = a - 1\n    else:\n        r = b\n    while r > 10:\n        r = r // 2\n    return r\n";

    fn py_entity(name: &str) -> Entity {
        entities(Language::Python, PY).into_iter().find(|e| e.name == name).unwrap()
    }

    fn run(lang: Language, src: &str, e: &Entity, op: OperatorId, seed: u64) -> Option<String> {
        let spec = OperatorSpec { id: op, likelihood: 1.0, min_complexity: 0, max_complexity: u32::MAX };
        let mut rng = candidate_rng(seed, "f", e, op);
        mutate(lang, src, e, &spec, &mut rng).map(|edits| apply_edits(src, &edits).unwrap())
    }

    #[test]
    fn entities_have_names_lines_and_complexity() {
        let es = entities(Language::Python, PY);
        assert_eq!(es.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["clamp", "pick"]);
        assert_eq!(es[0].line, 1);
        assert_eq!(es[0].complexity, 4); // for, if, elif
        assert_eq!(es[1].complexity, 4); // if, and, while
    }

    #[test]
    fn flip_turns_comparisons_and_boolean_operators() {
        let out = run(Language::Python, PY, &py_entity("pick"), OperatorId::OpFlip, 1).unwrap();
        assert!(out.contains("flag or a") && out.contains("r < 10") && out.contains("a + 1"), "{out}");
    }

    #[test]
    fn invert_if_swaps_plain_else_only() {
        let out = run(Language::Python, PY, &py_entity("pick"), OperatorId::CtrlInvertIf, 1).unwrap();
        assert!(out.contains("if flag and a:\n        r = b\n    else:\n        r = a - 1"), "{out}");
        // `clamp`'s if has an elif: not inverted.
        assert!(run(Language::Python, PY, &py_entity("clamp"), OperatorId::CtrlInvertIf, 1).is_none());
    }

    #[test]
    fn removals_delete_whole_statements_and_keep_blocks_valid() {
        let out = run(Language::Python, PY, &py_entity("pick"), OperatorId::RemoveLoop, 3).unwrap();
        assert!(!out.contains("while") && out.contains("    return r\n"), "{out}");
        let out = run(Language::Python, PY, &py_entity("pick"), OperatorId::RemoveAssign, 3).unwrap();
        assert!(Language::Python.parses_cleanly(&out));
        assert!(out.contains("pass"), "emptied blocks get `pass`: {out}");
    }

    #[test]
    fn const_change_and_break_chains() {
        let out = run(Language::Python, PY, &py_entity("clamp"), OperatorId::OpChangeConst, 7).unwrap();
        assert!(!out.contains("0 * 2") && Language::Python.parses_cleanly(&out), "{out}");
        let out = run(Language::Python, PY, &py_entity("clamp"), OperatorId::OpBreakChains, 7).unwrap();
        assert!(out.contains("out.append(v + 2)"), "{out}");
    }

    #[test]
    fn seeded_mutation_is_reproducible() {
        let e = py_entity("clamp");
        for op in [OperatorId::OpChange, OperatorId::CtrlShuffle, OperatorId::OpSwap] {
            assert_eq!(run(Language::Python, PY, &e, op, 42), run(Language::Python, PY, &e, op, 42));
        }
    }

    #[test]
    fn complexity_gate_blocks_simple_functions() {
        let src = "def add(a, b):\n    return a + b\n";
        let e = &entities(Language::Python, src)[0];
        let spec = OperatorSpec { id: OperatorId::OpChange, likelihood: 1.0, min_complexity: 3, max_complexity: 99 };
        assert!(mutate(Language::Python, src, e, &spec, &mut candidate_rng(0, "f", e, spec.id)).is_none());
    }

    #[test]
    fn class_operators_remove_bases_and_methods() {
        let src = "class A(Base):\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n";
        let e = entities(Language::Python, src).into_iter().find(|e| e.kind == EntityKind::Class).unwrap();
        assert_eq!(
            run(Language::Python, src, &e, OperatorId::ClassRmBase, 0).unwrap().lines().next(),
            Some("class A:")
        );
        let out = run(Language::Python, src, &e, OperatorId::ClassRmFuncs, 0).unwrap();
        assert!(Language::Python.parses_cleanly(&out) && out.matches("def ").count() < 2, "{out}");
        let out = run(Language::Python, src, &e, OperatorId::ClassShuffleFuncs, 0).unwrap();
        assert!(out.find("def g").unwrap() < out.find("def f").unwrap(), "{out}");
    }

    const RS: &str = "pub fn total(xs: &[i64], cap: i64) -> i64 {\n    let mut sum = 0;\n    for x in xs {\n        if *x > cap && cap != 0 {\n            sum += cap;\n        } else {\n            sum += *x * 2;\n        }\n    }\n    sum\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";

    #[test]
    fn rust_entities_skip_tests_and_operators_apply() {
        let es = entities(Language::Rust, RS);
        assert_eq!(es.len(), 1, "{es:?}");
        let e = &es[0];
        assert_eq!(e.complexity, 4); // for, if, &&
        let out = run(Language::Rust, RS, e, OperatorId::OpFlip, 5).unwrap();
        assert!(out.contains("*x < cap") || out.contains("cap == 0") || out.contains("||"), "{out}");
        let out = run(Language::Rust, RS, e, OperatorId::CtrlInvertIf, 5).unwrap();
        assert!(out.contains("&& cap != 0 {\n            sum += *x * 2;"), "{out}");
        let out = run(Language::Rust, RS, e, OperatorId::RemoveLoop, 5).unwrap();
        assert!(!out.contains("for x") && out.contains("    sum\n}"), "{out}");
        let out = run(Language::Rust, RS, e, OperatorId::CtrlShuffle, 5).unwrap();
        assert!(
            out.trim_end().ends_with("sum\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}"),
            "{out}"
        );
    }

    #[test]
    fn syntax_breaking_results_are_rejected() {
        // Removing the only statement of a Rust block is fine, but an edit that yields a
        // parse error must never come back.
        let src = "fn f(a: i32) -> i32 {\n    if a > 1 { a } else { 0 }\n}\n";
        let e = &entities(Language::Rust, src)[0];
        for op in ALL_OPERATORS {
            if let Some(out) = run(Language::Rust, src, e, *op, 1) {
                assert!(Language::Rust.parses_cleanly(&out), "{op:?}: {out}");
            }
        }
    }

    const GO: &str = "package p\n\nfunc Sum(xs []int, cap int) int {\n\ttotal := 0\n\tfor _, x := range xs {\n\t\tif x > cap && cap != 0 {\n\t\t\ttotal += cap\n\t\t} else {\n\t\t\ttotal += x * 2\n\t\t}\n\t}\n\treturn total\n}\n\nfunc (s *Stack) Push(v int) {\n\ts.items = append(s.items, v)\n}\n";

    #[test]
    fn go_entities_and_operators() {
        let es = entities(Language::Go, GO);
        assert_eq!(es.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["Sum", "Stack.Push"]);
        let e = &es[0];
        assert_eq!(e.complexity, 4); // for, if, &&
        let out = run(Language::Go, GO, e, OperatorId::OpFlip, 5).unwrap();
        assert!(out.contains("x < cap") || out.contains("cap == 0") || out.contains("||"), "{out}");
        let out = run(Language::Go, GO, e, OperatorId::CtrlInvertIf, 5).unwrap();
        assert!(out.contains("cap != 0 {\n\t\t\ttotal += x * 2"), "{out}");
        let out = run(Language::Go, GO, e, OperatorId::RemoveLoop, 5).unwrap();
        assert!(!out.contains("for _") && out.contains("\treturn total\n"), "{out}");
        let out = run(Language::Go, GO, e, OperatorId::RemoveAssign, 5).unwrap();
        assert!(out.matches("total +=").count() < 2 || !out.contains("total := 0"), "{out}");
        let out = run(Language::Go, GO, e, OperatorId::OpChangeConst, 5).unwrap();
        assert!(!out.contains("x * 2") || !out.contains("cap != 0"), "{out}");
        let out = run(Language::Go, GO, e, OperatorId::CtrlShuffle, 5).unwrap();
        assert!(Language::Go.parses_cleanly(&out) && out != GO, "{out}");
        for op in ALL_OPERATORS {
            if let Some(out) = run(Language::Go, GO, e, *op, 2) {
                assert!(Language::Go.parses_cleanly(&out), "{op:?}: {out}");
            }
        }
    }

    const JS: &str = "function pick(xs, n) {\n  const out = [];\n  for (let i = 0; i < xs.length && out.length < n; i++) {\n    if (xs[i] !== null) {\n      out.push(xs[i]);\n    } else {\n      out.push(0);\n    }\n  }\n  return out;\n}\n\nconst half = (x) => x / 2;\n\nclass Bag {\n  count(x) {\n    let c = 0;\n    while (c < x) { c += 1; }\n    return c;\n  }\n}\n\nsetTimeout(function () { return 1; }, 0);\n";

    #[test]
    fn javascript_entities_and_operators() {
        let es = entities(Language::JavaScript, JS);
        assert_eq!(es.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["pick", "half", "Bag.count"]);
        let e = &es[0];
        assert_eq!(e.complexity, 4); // for, if, &&
        let out = run(Language::JavaScript, JS, e, OperatorId::OpFlip, 5).unwrap();
        assert!(out.contains("=== null") || out.contains("i > xs") || out.contains("||"), "{out}");
        let out = run(Language::JavaScript, JS, e, OperatorId::CtrlInvertIf, 5).unwrap();
        assert!(out.contains("!== null) {\n      out.push(0);"), "{out}");
        let out = run(Language::JavaScript, JS, e, OperatorId::RemoveLoop, 5).unwrap();
        assert!(!out.contains("for (") && out.contains("  return out;\n"), "{out}");
        let out = run(Language::JavaScript, JS, e, OperatorId::RemoveAssign, 5).unwrap();
        assert!(!out.contains("const out = [];"), "{out}");
        // The `i++` of a for header and `let i = 0` there are never removed.
        assert!(out.contains("for (let i = 0;") && out.contains("i++)"), "{out}");
        // `let i = 0` and `push(0)` are no operands of a binary operator: nothing to change.
        assert_eq!(run(Language::JavaScript, JS, e, OperatorId::OpChangeConst, 5), None);
        let out = run(Language::JavaScript, JS, &es[1], OperatorId::OpChangeConst, 5).unwrap();
        assert!(out.contains("x / 1") || out.contains("x / 3"), "{out}");
        // An expression-bodied arrow has no statements to shuffle.
        assert!(run(Language::JavaScript, JS, &es[1], OperatorId::CtrlShuffle, 5).is_none());
        for op in ALL_OPERATORS {
            if let Some(out) = run(Language::JavaScript, JS, e, *op, 3) {
                assert!(Language::JavaScript.parses_cleanly(&out), "{op:?}: {out}");
            }
        }
    }

    #[test]
    fn typescript_parses_types_and_skips_signatures() {
        let src = "export function clamp(v: number, lo: number, hi: number): number {\n  if (v < lo) { return lo; }\n  if (v > hi) { return hi; }\n  return v;\n}\nexport function f(a: string): string;\ninterface I { m(x: number): number }\n";
        assert_eq!(Language::of_path("src/a.ts"), Some(Language::TypeScript));
        assert_eq!(Language::of_path("src/a.d.ts"), None);
        assert_eq!(Language::of_path("lib/x.mjs"), Some(Language::JavaScript));
        let es = entities(Language::TypeScript, src);
        assert_eq!(es.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["clamp"]);
        let out = run(Language::TypeScript, src, &es[0], OperatorId::RemoveCond, 1).unwrap();
        assert!(out.matches("if (").count() < 2 && Language::TypeScript.parses_cleanly(&out), "{out}");
        let out = run(Language::TypeScript, src, &es[0], OperatorId::OpSwap, 1).unwrap();
        assert!(out.contains("lo < v") || out.contains("hi > v"), "{out}");
    }

    /// The incremental check a [`ParsedSource`] makes of a mutated file says what a full parse
    /// of it says, for random edits that break and mend the syntax (multi-line ones among them,
    /// so that rows and columns shift), in each language.
    #[test]
    fn incremental_reparse_agrees_with_a_full_parse() {
        let snippets =
            ["", ")", "(", ":", "\n", "x = 1\n", "    ", "if a:\n    b\n", "\"", "]", "{", "}", ";", "a\n\nb"];
        let mut rng = StdRng::seed_from_u64(7);
        let (mut clean, mut broken) = (0, 0);
        for (lang, src) in [
            (Language::Python, PY),
            (Language::Rust, RS),
            (Language::Go, GO),
            (Language::JavaScript, JS),
            (Language::TypeScript, JS),
        ] {
            let mut parsed = ParsedSource::new(lang, src).unwrap();
            for _ in 0..300 {
                let mut cuts: Vec<usize> = (0..4).map(|_| rng.random_range(0..=src.len())).collect();
                cuts.sort();
                let mut edits = Vec::new();
                for c in cuts.chunks(2) {
                    if rng.random_bool(0.7) {
                        edits.push(Edit {
                            start: c[0],
                            end: c[1],
                            text: snippets.choose(&mut rng).unwrap().to_string(),
                        });
                    }
                }
                let mutated = apply_edits(src, &edits).unwrap();
                let full = lang.parses_cleanly(&mutated);
                assert_eq!(parsed.parses_cleanly_after(&edits, &mutated), full, "{lang:?} {edits:?}");
                if full {
                    clean += 1;
                } else {
                    broken += 1;
                }
            }
        }
        assert!(clean > 20 && broken > 20, "both outcomes seen: {clean} clean, {broken} broken");
    }
}
