//! swebench's log parsers (`PARSER_REGISTRY`), ported from swebench 5.0.2.
//!
//! Each parser turns test output into a [`StatusMap`]. Registry names are swebench's
//! (`parse_log_pytest`, `parse_log_django`, …); the short forms without the `parse_log_`
//! prefix are accepted too.

mod cargo;
mod gotest;
mod python;

pub use crate::status::StatusMap;
pub use cargo::parse_cargo;
pub use gotest::parse_gotest;
pub use python::{
    parse_django, parse_matplotlib, parse_pytest, parse_pytest_options, parse_pytest_v2, parse_seaborn, parse_sympy,
};

/// Why a parser produced no map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The name is not a parser swebench registers.
    #[error("unknown log parser {0:?}; known parsers: {known}", known = implemented_parsers().join(", "))]
    Unknown(String),
    /// swebench registers this parser but FrogNano has not ported it.
    #[error("log parser {0:?} is registered in swebench but not ported to FrogNano yet")]
    NotPorted(String),
    /// The Python parser raises on this input (so swebench writes no report); we report the
    /// same outcome as an error.
    #[error("{0}")]
    Crash(String),
}

/// A log parser function.
pub type ParserFn = fn(&str) -> Result<StatusMap, ParseError>;

/// Implemented parsers: registry name → function.
const IMPLEMENTED: &[(&str, ParserFn)] = &[
    ("parse_log_pytest", parse_pytest),
    ("parse_log_pytest_options", parse_pytest_options),
    ("parse_log_django", parse_django),
    ("parse_log_pytest_v2", parse_pytest_v2),
    ("parse_log_seaborn", parse_seaborn),
    ("parse_log_sympy", parse_sympy),
    ("parse_log_matplotlib", parse_matplotlib),
    ("parse_log_astroid", parse_pytest),
    ("parse_log_flask", parse_pytest),
    ("parse_log_marshmallow", parse_pytest),
    ("parse_log_pvlib", parse_pytest),
    ("parse_log_pyvista", parse_pytest),
    ("parse_log_sqlfluff", parse_pytest),
    ("parse_log_xarray", parse_pytest),
    ("parse_log_pydicom", parse_pytest_options),
    ("parse_log_requests", parse_pytest_options),
    ("parse_log_pylint", parse_pytest_options),
    ("parse_log_astropy", parse_pytest_v2),
    ("parse_log_scikit", parse_pytest_v2),
    ("parse_log_sphinx", parse_pytest_v2),
    ("parse_log_cargo", parse_cargo),
    ("parse_log_gotest", parse_gotest),
];

/// Parsers swebench 5.0.2 registers that are not ported yet (JS, C, Java, PHP, Ruby).
const NOT_PORTED: &[&str] = &[
    "parse_log_calypso",
    "parse_log_bpmn_js",
    "parse_log_carbon",
    "parse_log_eslint",
    "parse_log_grommet",
    "parse_log_highlightjs",
    "parse_log_lighthouse",
    "parse_log_next",
    "parse_log_openlayers",
    "parse_log_prismjs",
    "parse_log_quarto_cli",
    "parse_log_chart_js",
    "parse_log_marked",
    "parse_log_p5js",
    "parse_log_react_pdf",
    "parse_log_jest",
    "parse_log_jest_json",
    "parse_log_vitest",
    "parse_log_karma",
    "parse_log_tap",
    "parse_log_immutable_js",
    "parse_log_redis",
    "parse_log_jq",
    "parse_log_doctest",
    "parse_log_micropython_test",
    "parse_log_googletest",
    "parse_log_maven",
    "parse_log_ant",
    "parse_log_gradle_custom",
    "parse_log_phpunit",
    "parse_log_minitest",
    "parse_log_cucumber",
    "parse_log_ruby_unit",
    "parse_log_rspec_transformed_json",
    "parse_log_jekyll",
];

/// Registry names of every parser FrogNano implements.
pub fn implemented_parsers() -> Vec<&'static str> {
    IMPLEMENTED.iter().map(|(n, _)| *n).collect()
}

/// Looks a parser up by registry name (`parse_log_django`) or short name (`django`).
pub fn parser_by_name(name: &str) -> Result<ParserFn, ParseError> {
    let full = if name.starts_with("parse_log_") { name.to_string() } else { format!("parse_log_{name}") };
    if let Some((_, f)) = IMPLEMENTED.iter().find(|(n, _)| *n == full) {
        return Ok(*f);
    }
    if NOT_PORTED.contains(&full.as_str()) {
        return Err(ParseError::NotPorted(full));
    }
    Err(ParseError::Unknown(name.to_string()))
}

/// Parses `log` with the named parser.
pub fn parse_log(parser: &str, log: &str) -> Result<StatusMap, ParseError> {
    parser_by_name(parser)?(log)
}

/// swebench 4.x chose the parser by repository (`MAP_REPO_TO_PARSER`); v5 instances carry
/// `log_parser`. This is the v4 table for the Python, Rust and Go repositories.
pub fn parser_for_repo(repo: &str) -> Option<&'static str> {
    Some(match repo {
        "astropy/astropy" => "parse_log_astropy",
        "django/django" => "parse_log_django",
        "marshmallow-code/marshmallow" => "parse_log_marshmallow",
        "matplotlib/matplotlib" => "parse_log_matplotlib",
        "mwaskom/seaborn" => "parse_log_seaborn",
        "pallets/flask" => "parse_log_flask",
        "psf/requests" => "parse_log_requests",
        "pvlib/pvlib-python" => "parse_log_pvlib",
        "pydata/xarray" => "parse_log_xarray",
        "pydicom/pydicom" => "parse_log_pydicom",
        "pylint-dev/astroid" => "parse_log_astroid",
        "pylint-dev/pylint" => "parse_log_pylint",
        "pytest-dev/pytest" => "parse_log_pytest",
        "pyvista/pyvista" => "parse_log_pyvista",
        "scikit-learn/scikit-learn" => "parse_log_scikit",
        "sqlfluff/sqlfluff" => "parse_log_sqlfluff",
        "sphinx-doc/sphinx" => "parse_log_sphinx",
        "sympy/sympy" => "parse_log_sympy",
        "burntsushi/ripgrep" | "sharkdp/bat" | "astral-sh/ruff" | "tokio-rs/tokio" | "uutils/coreutils"
        | "nushell/nushell" | "tokio-rs/axum" => "parse_log_cargo",
        "caddyserver/caddy" | "hashicorp/terraform" | "prometheus/prometheus" | "gohugoio/hugo" | "gin-gonic/gin" => {
            "parse_log_gotest"
        }
        _ => return None,
    })
}
