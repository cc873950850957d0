//! Environments that fit a release's era: a Python release's dependencies are resolved with
//! only the packages uploaded before the release itself (uv's `--exclude-newer`), so an old
//! release gets the library versions it was tested with, not today's. The test tools
//! (pytest and its own dependencies) get a later cutoff when the release predates the
//! interpreter: a pytest older than the interpreter does not run on it.

use std::path::Path;
use std::process::Command;

/// The distributions resolved with the tools' cutoff rather than the release's: pytest and
/// what it depends on across its 6–8 majors.
pub const TEST_TOOLS: [&str; 6] = ["pytest", "pluggy", "iniconfig", "py", "exceptiongroup", "tomli"];

/// The release day (UTC) of each CPython minor version: a test tool must be at least as
/// recent to run on it (pytest 7.2.0 came out a day before Python 3.11.0, 6.2.5 after 3.10.0
/// had its release candidates).
const PYTHON_RELEASES: [(&str, &str); 7] = [
    ("3.8", "2019-10-14T00:00:00Z"),
    ("3.9", "2020-10-05T00:00:00Z"),
    ("3.10", "2021-10-04T00:00:00Z"),
    ("3.11", "2022-10-24T00:00:00Z"),
    ("3.12", "2023-10-02T00:00:00Z"),
    ("3.13", "2024-10-07T00:00:00Z"),
    ("3.14", "2025-10-07T00:00:00Z"),
];

/// The cutoffs one environment is resolved with.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct EraPlan {
    /// Everything is resolved from packages uploaded before this time (the release's).
    pub exclude_newer: Option<String>,
    /// [`TEST_TOOLS`] are resolved from packages uploaded before this time.
    pub tools_exclude_newer: Option<String>,
}

/// The first 19 characters of an ISO 8601 UTC time (`YYYY-MM-DDTHH:MM:SS`), what two times
/// are compared by.
fn seconds_prefix(t: &str) -> &str {
    t.get(..19).unwrap_or(t)
}

/// Whether `t` looks like `YYYY-MM-DDTHH:MM:SS…Z`.
fn is_utc_time(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() >= 20
        && t.ends_with('Z')
        && [4, 7].iter().all(|&i| b[i] == b'-')
        && b[10] == b'T'
        && [13, 16].iter().all(|&i| b[i] == b':')
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18].iter().all(|&i| b[i].is_ascii_digit())
}

/// The cutoffs for a release published at `released` (UTC ISO 8601; `None`: unknown, so
/// today's packages) run on Python `python` (`3.11.7`). The tools' cutoff is the later of
/// the release and the interpreter's release day; a Python newer than the table leaves the
/// tools unbounded.
pub fn plan(released: Option<&str>, python: &str) -> EraPlan {
    let Some(released) = released.filter(|t| is_utc_time(t)) else { return EraPlan::default() };
    let minor: String = python.split('.').take(2).collect::<Vec<_>>().join(".");
    let floor = PYTHON_RELEASES.iter().find(|(v, _)| *v == minor).map(|(_, t)| *t);
    let newest_known = PYTHON_RELEASES.last().map(|(v, _)| *v).unwrap_or_default();
    let beyond_table = floor.is_none() && version_key(&minor) > version_key(newest_known);
    let tools = match floor {
        Some(f) if seconds_prefix(f) > seconds_prefix(released) => Some(f.to_string()),
        Some(_) => Some(released.to_string()),
        None if beyond_table => None,
        None => Some(released.to_string()),
    };
    EraPlan { exclude_newer: Some(released.to_string()), tools_exclude_newer: tools }
}

/// The current time, `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn version_key(v: &str) -> (u32, u32) {
    let mut it = v.split('.').map(|p| p.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

impl EraPlan {
    /// Whether any cutoff applies.
    pub fn is_era(&self) -> bool {
        self.exclude_newer.is_some()
    }

    /// uv's arguments for this plan: `--exclude-newer T` and, when the tools' cutoff T2
    /// differs, `--exclude-newer-package NAME=T2` for each test tool (unbounded tools get the
    /// current time: a per-package limit is the only way to lift the global one).
    pub fn uv_args(&self) -> Vec<String> {
        let Some(t) = &self.exclude_newer else { return Vec::new() };
        let mut args = vec!["--exclude-newer".to_string(), t.clone()];
        let tools = self.tools_exclude_newer.clone().unwrap_or_else(utc_now);
        if tools != *t {
            for tool in TEST_TOOLS {
                args.push("--exclude-newer-package".into());
                args.push(format!("{tool}={tools}"));
            }
        }
        args
    }
}

/// When `version` of the PyPI project `name` was uploaded, read from PyPI's JSON API
/// (`https://pypi.org/pypi/NAME/json`, with curl): the source distribution's upload time,
/// else the release's earliest file.
pub fn pypi_release_time(name: &str, version: &str) -> anyhow::Result<String> {
    let url = format!("https://pypi.org/pypi/{name}/json");
    let out = Command::new("curl")
        .args(["-sSfL", "--retry", "2", "--max-time", "60", &url])
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run curl: {e}"))?;
    anyhow::ensure!(out.status.success(), "fetching {url} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| anyhow::anyhow!("{url}: not JSON: {e}"))?;
    release_time_from_json(&json, version).map_err(|e| anyhow::anyhow!("{url}: {e}"))
}

/// The upload time of `version` in a PyPI project JSON document (see [`pypi_release_time`]).
pub fn release_time_from_json(json: &serde_json::Value, version: &str) -> anyhow::Result<String> {
    let files =
        json["releases"][version].as_array().ok_or_else(|| anyhow::anyhow!("no release {version:?} in `releases`"))?;
    let time = |f: &serde_json::Value| f["upload_time_iso_8601"].as_str().map(str::to_string);
    let sdist = files.iter().find(|f| f["packagetype"] == "sdist").and_then(time);
    let earliest = files.iter().filter_map(time).min_by(|a, b| seconds_prefix(a).cmp(seconds_prefix(b)));
    let t = sdist.or(earliest).ok_or_else(|| anyhow::anyhow!("release {version:?} has no file with an upload time"))?;
    anyhow::ensure!(is_utc_time(&t), "release {version:?}: upload time {t:?} is not an ISO 8601 UTC time");
    Ok(t)
}

/// The committer time of `commit` in `repo`, UTC (`YYYY-MM-DDTHH:MM:SSZ`): a local
/// repository's era.
pub fn commit_time(repo: &Path, commit: &str) -> anyhow::Result<String> {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", commit])
        .env("TZ", "UTC")
        .current_dir(repo)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run git: {e}"))?;
    anyhow::ensure!(out.status.success(), "git log {commit} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    anyhow::ensure!(is_utc_time(&t), "git log {commit}: unexpected time {t:?}");
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cutoffs_follow_the_release_and_the_interpreter() {
        // An old release on Python 3.11: its own time for everything, 3.11's day for pytest.
        let p = plan(Some("2021-01-31T19:03:35.123Z"), "3.11.7");
        assert_eq!(p.exclude_newer.as_deref(), Some("2021-01-31T19:03:35.123Z"));
        assert_eq!(p.tools_exclude_newer.as_deref(), Some("2022-10-24T00:00:00Z"));
        let args = p.uv_args();
        assert_eq!(args[..2], ["--exclude-newer", "2021-01-31T19:03:35.123Z"]);
        assert_eq!(args[2..4], ["--exclude-newer-package", "pytest=2022-10-24T00:00:00Z"]);
        assert_eq!(args.len(), 2 + 2 * TEST_TOOLS.len());
        // A release newer than its interpreter: one cutoff for all.
        let p = plan(Some("2024-03-01T10:00:00Z"), "3.11.7");
        assert_eq!(p.tools_exclude_newer.as_deref(), Some("2024-03-01T10:00:00Z"));
        assert_eq!(p.uv_args(), ["--exclude-newer", "2024-03-01T10:00:00Z"]);
        // Same day, earlier hour than the interpreter's midnight: still the release's time.
        assert_eq!(
            plan(Some("2022-10-24T09:00:00Z"), "3.11.0").tools_exclude_newer.as_deref(),
            Some("2022-10-24T09:00:00Z")
        );
        // A Python the table does not know yet: tools as of now.
        let p = plan(Some("2021-01-31T19:03:35Z"), "3.19.0");
        assert_eq!(p.tools_exclude_newer, None);
        let args = p.uv_args();
        let now = args[3].strip_prefix("pytest=").unwrap();
        assert!(is_utc_time(now) && now > "2026-01-01" && now < "2100", "{now}");
        // No or malformed time: today's packages.
        assert_eq!(plan(None, "3.11.7"), EraPlan::default());
        assert_eq!(plan(Some("31/01/2021"), "3.11.7"), EraPlan::default());
        assert!(EraPlan::default().uv_args().is_empty() && !EraPlan::default().is_era());
    }

    #[test]
    fn the_release_time_is_the_sdist_upload_else_the_earliest_file() {
        let json = serde_json::json!({"releases": {
            "2.11.3": [
                {"packagetype": "bdist_wheel", "upload_time_iso_8601": "2021-01-31T19:03:33.100Z"},
                {"packagetype": "sdist", "upload_time_iso_8601": "2021-01-31T19:03:35.200Z"}
            ],
            "1.0": [
                {"packagetype": "bdist_wheel", "upload_time_iso_8601": "2019-05-01T00:00:09Z"},
                {"packagetype": "bdist_egg", "upload_time_iso_8601": "2019-04-30T23:59:59Z"}
            ],
            "0.1": [],
            "0.2": [{"packagetype": "sdist", "upload_time_iso_8601": "yesterday"}]
        }});
        assert_eq!(release_time_from_json(&json, "2.11.3").unwrap(), "2021-01-31T19:03:35.200Z");
        assert_eq!(release_time_from_json(&json, "1.0").unwrap(), "2019-04-30T23:59:59Z");
        assert_eq!(release_time_from_json(&json, "9.9").unwrap_err().to_string(), "no release \"9.9\" in `releases`");
        assert_eq!(
            release_time_from_json(&json, "0.1").unwrap_err().to_string(),
            "release \"0.1\" has no file with an upload time"
        );
        assert!(release_time_from_json(&json, "0.2").unwrap_err().to_string().contains("not an ISO 8601 UTC time"));
    }

    #[test]
    fn a_local_commit_gives_its_utc_committer_time() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let out = Command::new("git")
                .args(args)
                .current_dir(dir.path())
                .env("GIT_COMMITTER_DATE", "2020-06-01T12:00:00+02:00")
                .env("GIT_AUTHOR_DATE", "2020-06-01T12:00:00+02:00")
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        };
        git(&["init", "-q"]);
        git(&["commit", "-q", "--allow-empty", "-m", "x"]);
        assert_eq!(commit_time(dir.path(), "HEAD").unwrap(), "2020-06-01T10:00:00Z");
        assert!(commit_time(dir.path(), "nope").is_err());
    }
}
