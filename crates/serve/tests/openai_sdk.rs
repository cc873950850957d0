//! The server driven by the official `openai` Python SDK (scripts/serve_openai_sdk_test.py),
//! from the git-ignored venv `.venv-openai` that scripts/ci-setup.sh creates.

use crate::common;

#[test]
fn openai_python_sdk() {
    common::run_python_client_checks(".venv-openai", "serve_openai_sdk_test.py", "openai_python_sdk", "openai SDK");
}
