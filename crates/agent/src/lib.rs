//! The coding agent: Llm trait, tool-call codec, the five tools, the loop, trajectories.
