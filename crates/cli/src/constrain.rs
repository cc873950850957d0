//! `--constrain-tools` / `--no-constrain-tools`: one pair of flags, shared by every command
//! whose model replies to requests with tools (`serve`, `solve`, `eval run`, `synth
//! calibrate`).

/// Whether replies to requests with tools are sampled under a grammar of the tool calls
/// (flattened into each command).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct ConstrainToolsArgs {
    /// Sample the model's replies to requests with tools under a grammar of the tool calls:
    /// free text, or calls of the offered tools with arguments under their schemas, so a
    /// malformed call cannot be produced (docs/structured.md). Default: on, unless the model
    /// is Qwen3.5/FrogNano, which writes its own format as trained. Needs a model run in
    /// this process.
    #[arg(long, conflicts_with = "no_constrain_tools")]
    pub constrain_tools: bool,
    /// Leave tool calls unconstrained (see --constrain-tools).
    #[arg(long)]
    pub no_constrain_tools: bool,
}

impl ConstrainToolsArgs {
    /// `Some(true)` for --constrain-tools, `Some(false)` for --no-constrain-tools, `None`
    /// (the model decides) for neither.
    pub fn choice(&self) -> Option<bool> {
        match (self.constrain_tools, self.no_constrain_tools) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        constrain: ConstrainToolsArgs,
    }

    #[test]
    fn the_flags_give_the_choice_and_exclude_each_other() {
        let choice = |args: &[&str]| Top::try_parse_from([&["x"], args].concat()).map(|t| t.constrain.choice());
        assert_eq!(choice(&[]).unwrap(), None);
        assert_eq!(choice(&["--constrain-tools"]).unwrap(), Some(true));
        assert_eq!(choice(&["--no-constrain-tools"]).unwrap(), Some(false));
        let err = choice(&["--constrain-tools", "--no-constrain-tools"]).unwrap_err().to_string();
        assert!(err.contains("cannot be used with"), "{err}");
    }
}
