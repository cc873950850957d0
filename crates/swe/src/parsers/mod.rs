//! swebench's log parsers (`PARSER_REGISTRY`), ported from swebench 5.0.2.
//!
//! Each parser turns test output into a [`StatusMap`]. Registry names are swebench's
//! (`parse_log_pytest`, `parse_log_django`, …); the short forms without the `parse_log_`
//! prefix are accepted too.

mod cargo;
mod gotest;
mod javascript;
mod other_langs;
pub mod pyre;
mod python;
mod xml;

pub use crate::status::StatusMap;
pub use cargo::parse_cargo;
pub use gotest::parse_gotest;
pub use javascript::*;
pub use other_langs::*;
pub use python::{
    parse_django, parse_matplotlib, parse_pytest, parse_pytest_options, parse_pytest_v2, parse_seaborn, parse_sympy,
};

/// Why a parser produced no map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The name is not a parser swebench registers.
    #[error("unknown log parser {0:?}; known parsers: {known}", known = implemented_parsers().join(", "))]
    Unknown(String),
    /// The Python parser raises on this input (so swebench writes no report); we report the
    /// same outcome as an error.
    #[error("{0}")]
    Crash(String),
}

/// What some parsers read from swebench's `TestSpec`: `parse_log_next` and
/// `parse_log_lighthouse` branch on `version`, `parse_log_immutable_js` and
/// `parse_log_jekyll` on the PR number in `instance_id`. Without them those parsers fail as
/// the Python ones do when given no spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParseContext {
    /// The instance id.
    pub instance_id: Option<String>,
    /// The instance's `version`.
    pub version: Option<String>,
}

/// A log parser function.
pub type ParserFn = fn(&str, &ParseContext) -> Result<StatusMap, ParseError>;

macro_rules! plain {
    ($f:expr) => {
        |log: &str, _: &ParseContext| $f(log)
    };
}

/// Every parser of swebench 5.0.2's `PARSER_REGISTRY`: registry name → function.
const IMPLEMENTED: &[(&str, ParserFn)] = &[
    // Python
    ("parse_log_pytest", plain!(parse_pytest)),
    ("parse_log_pytest_options", plain!(parse_pytest_options)),
    ("parse_log_django", plain!(parse_django)),
    ("parse_log_pytest_v2", plain!(parse_pytest_v2)),
    ("parse_log_seaborn", plain!(parse_seaborn)),
    ("parse_log_sympy", plain!(parse_sympy)),
    ("parse_log_matplotlib", plain!(parse_matplotlib)),
    ("parse_log_astroid", plain!(parse_pytest)),
    ("parse_log_flask", plain!(parse_pytest)),
    ("parse_log_marshmallow", plain!(parse_pytest)),
    ("parse_log_pvlib", plain!(parse_pytest)),
    ("parse_log_pyvista", plain!(parse_pytest)),
    ("parse_log_sqlfluff", plain!(parse_pytest)),
    ("parse_log_xarray", plain!(parse_pytest)),
    ("parse_log_pydicom", plain!(parse_pytest_options)),
    ("parse_log_requests", plain!(parse_pytest_options)),
    ("parse_log_pylint", plain!(parse_pytest_options)),
    ("parse_log_astropy", plain!(parse_pytest_v2)),
    ("parse_log_scikit", plain!(parse_pytest_v2)),
    ("parse_log_sphinx", plain!(parse_pytest_v2)),
    // JavaScript
    ("parse_log_calypso", plain!(parse_calypso)),
    ("parse_log_bpmn_js", plain!(parse_bpmn_js)),
    ("parse_log_carbon", plain!(parse_carbon)),
    ("parse_log_eslint", plain!(parse_eslint)),
    ("parse_log_grommet", plain!(parse_grommet)),
    ("parse_log_highlightjs", plain!(parse_highlightjs)),
    ("parse_log_lighthouse", parse_lighthouse),
    ("parse_log_next", parse_next),
    ("parse_log_openlayers", plain!(parse_openlayers)),
    ("parse_log_prismjs", plain!(parse_prismjs)),
    ("parse_log_quarto_cli", plain!(parse_quarto_cli)),
    ("parse_log_chart_js", plain!(parse_chart_js)),
    ("parse_log_marked", plain!(parse_marked)),
    ("parse_log_p5js", plain!(parse_p5js)),
    ("parse_log_react_pdf", plain!(parse_carbon)),
    ("parse_log_jest", plain!(parse_jest)),
    ("parse_log_jest_json", plain!(parse_jest_json)),
    ("parse_log_vitest", plain!(parse_vitest)),
    ("parse_log_karma", plain!(parse_karma)),
    ("parse_log_tap", plain!(parse_tap)),
    ("parse_log_immutable_js", parse_immutable_js),
    // C
    ("parse_log_redis", plain!(parse_redis)),
    ("parse_log_jq", plain!(parse_jq)),
    ("parse_log_doctest", plain!(parse_doctest)),
    ("parse_log_micropython_test", plain!(parse_micropython_test)),
    ("parse_log_googletest", plain!(parse_googletest)),
    // Go
    ("parse_log_gotest", plain!(parse_gotest)),
    // Java
    ("parse_log_maven", plain!(parse_maven)),
    ("parse_log_ant", plain!(parse_ant)),
    ("parse_log_gradle_custom", plain!(parse_gradle_custom)),
    // PHP
    ("parse_log_phpunit", plain!(parse_phpunit)),
    // Ruby
    ("parse_log_minitest", plain!(parse_minitest)),
    ("parse_log_cucumber", plain!(parse_cucumber)),
    ("parse_log_ruby_unit", plain!(parse_ruby_unit)),
    ("parse_log_rspec_transformed_json", plain!(parse_rspec_transformed_json)),
    ("parse_log_jekyll", parse_jekyll),
    // Rust
    ("parse_log_cargo", plain!(parse_cargo)),
];

/// Parsers of FrogNano's own, for runners swebench has none for (tasks that `frognano synth`
/// makes name them in `log_parser`, and `eval grade` finds them here like swebench's).
const OWN: &[(&str, ParserFn)] = &[
    // tape (most of npm's small utility packages): one status per `# test`, not per assertion.
    ("parse_log_tape", plain!(parse_tape_tests)),
];

/// Registry names of every parser FrogNano implements: swebench's, then its own.
pub fn implemented_parsers() -> Vec<&'static str> {
    IMPLEMENTED.iter().chain(OWN).map(|(n, _)| *n).collect()
}

/// Looks a parser up by registry name (`parse_log_django`) or short name (`django`).
pub fn parser_by_name(name: &str) -> Result<ParserFn, ParseError> {
    let full = if name.starts_with("parse_log_") { name.to_string() } else { format!("parse_log_{name}") };
    if let Some((_, f)) = IMPLEMENTED.iter().chain(OWN).find(|(n, _)| *n == full) {
        return Ok(*f);
    }
    Err(ParseError::Unknown(name.to_string()))
}

/// Parses `log` with the named parser, without instance context (see [`ParseContext`]).
pub fn parse_log(parser: &str, log: &str) -> Result<StatusMap, ParseError> {
    parser_by_name(parser)?(log, &ParseContext::default())
}

/// Parses `log` with the named parser and the instance's context.
pub fn parse_log_with(parser: &str, log: &str, ctx: &ParseContext) -> Result<StatusMap, ParseError> {
    parser_by_name(parser)?(log, ctx)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_parser_runs_and_names_resolve() {
        assert_eq!(IMPLEMENTED.len(), 57, "swebench 5.0.2 registers 57 parsers");
        assert_eq!(implemented_parsers().len(), IMPLEMENTED.len() + OWN.len());
        let log = "+ : '>>>>> Start Test Output'\nPASSED a::b\n  ✓ works (3 ms)\nok 1 t\n[ok]: x (1 ms)\n\
                   Starting browser Chrome\n  suite\n    ✔ passes\nSUMMARY:\n--- PASS: T (0.00s)\n";
        for version in [None, Some("1.27"), Some("9.5"), Some("4.0"), Some("2.0")] {
            for id in [None, Some("x__y-2006"), Some("jekyll__jekyll-9141")] {
                let ctx = ParseContext { instance_id: id.map(Into::into), version: version.map(Into::into) };
                for name in implemented_parsers() {
                    let _ = parse_log_with(name, log, &ctx);
                }
            }
        }
        assert!(parse_log("jest", log).unwrap().contains_key("works"));
        assert!(matches!(parse_log("nope", log), Err(ParseError::Unknown(_))));
    }
}
