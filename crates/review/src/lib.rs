//! # frognano-review
//!
//! `frognano review [DIR]`: a local web page where a person reviews what the agent did before
//! anything is applied (`docs/review.md`). It lists every run under DIR — `frognano solve`
//! outputs, `frognano eval` and `frognano train` run directories — and shows one run step by
//! step with its patch; the reviewer applies the patch (after `git apply --check`), rejects
//! it with a note, or sends the run back with a comment, which continues the agent's
//! conversation in a new run linked to the old one. Runs in progress stream their steps
//! (server-sent events). Every asset is embedded in the binary; nothing is fetched from the
//! network.
//!
//! The server binds to loopback and refuses requests whose `Host` is not the loopback
//! address it listens on (a web page elsewhere cannot reach it through DNS rebinding);
//! with another `host` every request needs the token printed at start. Requests that
//! change anything are JSON POSTs, which a page of another origin cannot send without a
//! preflight this server never answers.

pub mod decisions;
pub mod diff;
pub mod runs;

use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use decisions::Decision;
use frognano_agent::run_dir::{self, RunInfo};
use frognano_agent::solve::{ModelChoice, SolveConfig, TaskInput};
use frognano_protocol::Llm;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

/// Builds the model a run is sent back to (given who answered it, [`ModelChoice`]); lets a
/// caller that holds a model already (a test's scripted model, an embedding program) answer
/// instead of the one `frognano solve` would load.
pub type LlmFactory = Arc<dyn Fn(&ModelChoice) -> anyhow::Result<Box<dyn Llm>> + Send + Sync>;

/// Settings of a review server.
#[derive(Clone)]
pub struct ReviewConfig {
    /// The folder whose runs are listed.
    pub root: PathBuf,
    /// Address to bind (default 127.0.0.1; anything that is not loopback requires a token).
    pub host: String,
    /// Port (0: a free one).
    pub port: u16,
    /// The token every request must carry (`?token=` once, then a cookie). `None`: none on
    /// loopback, a random one on any other host.
    pub token: Option<String>,
    /// Who the decisions are recorded as.
    pub reviewer: String,
    /// How a run sent back continues: limits, sampling, sandbox (`task`, `model` and `output`
    /// are set per run).
    pub continue_with: SolveConfig,
    /// The model a run is sent back to (`None`: the one that made it, from its run.json).
    pub model: Option<ModelChoice>,
    /// Builds the model instead of loading it as `frognano solve` does.
    pub llm_factory: Option<LlmFactory>,
}

impl ReviewConfig {
    /// Reviews `root` on a free loopback port, decisions recorded as the login name.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ReviewConfig {
            root: root.into(),
            host: "127.0.0.1".to_string(),
            port: 0,
            token: None,
            reviewer: default_reviewer(),
            continue_with: SolveConfig::for_repo("."),
            model: None,
            llm_factory: None,
        }
    }
}

/// The login name (`$USER`, `$LOGNAME`), else `reviewer`.
pub fn default_reviewer() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "reviewer".to_string())
}

/// A run the server started (a Send back), until its directory shows it.
#[derive(Debug, Clone)]
enum Job {
    Running,
    Failed(String),
    Finished,
}

struct App {
    root: PathBuf,
    config: ReviewConfig,
    token: Option<String>,
    /// `Host` headers accepted (loopback only; empty: any, the token guards).
    allowed_hosts: Vec<String>,
    jobs: Mutex<HashMap<String, Job>>,
}

/// A bound review server: [`ReviewServer::url`] to open, then [`ReviewServer::run`].
pub struct ReviewServer {
    listener: std::net::TcpListener,
    app: Arc<App>,
    url: String,
}

impl ReviewServer {
    /// Binds the port and checks the folder; nothing is served until [`ReviewServer::run`].
    pub fn bind(config: ReviewConfig) -> anyhow::Result<Self> {
        let root = config.root.canonicalize().map_err(|e| {
            anyhow::anyhow!(
                "cannot review {}: {e} (pass the folder that holds the runs, e.g. frognano-runs)",
                config.root.display()
            )
        })?;
        if !root.is_dir() {
            anyhow::bail!("cannot review {}: it is not a folder", root.display());
        }
        let ip: IpAddr = config.host.parse().map_err(|_| {
            anyhow::anyhow!("--host {:?} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)", config.host)
        })?;
        let listener = std::net::TcpListener::bind(SocketAddr::new(ip, config.port))
            .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", config.host, config.port))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let loopback = ip.is_loopback();
        let token = match (&config.token, loopback) {
            (Some(t), _) => Some(t.clone()),
            (None, true) => None,
            (None, false) => Some(format!("{:032x}", rand::random::<u128>())),
        };
        let allowed_hosts = if loopback {
            vec![
                format!("127.0.0.1:{port}"),
                format!("localhost:{port}"),
                format!("[::1]:{port}"),
                format!("{ip}:{port}"),
            ]
        } else {
            Vec::new()
        };
        let shown_host = if ip.is_unspecified() { "127.0.0.1".to_string() } else { config.host.clone() };
        let shown_host = if shown_host.contains(':') { format!("[{shown_host}]") } else { shown_host };
        let mut url = format!("http://{shown_host}:{port}/");
        if let Some(t) = &token {
            url.push_str(&format!("?token={t}"));
        }
        let app = Arc::new(App { root, config, token, allowed_hosts, jobs: Mutex::new(HashMap::new()) });
        Ok(ReviewServer { listener, app, url })
    }

    /// The address to open (with `?token=…` when one is needed).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The folder being reviewed (canonical).
    pub fn root(&self) -> &Path {
        &self.app.root
    }

    /// Serves until the process ends.
    pub fn run(self) -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(self.listener)?;
            axum::serve(listener, router(self.app)).await?;
            anyhow::Ok(())
        })
    }

    /// Serves on a thread of its own (for tests and embedding); returns the URL.
    pub fn spawn(self) -> String {
        let url = self.url.clone();
        std::thread::spawn(move || {
            if let Err(e) = self.run() {
                tracing::error!("the review server stopped: {e:#}");
            }
        });
        url
    }
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(INDEX_HTML) }))
        .route("/app.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], APP_JS) }))
        .route("/style.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE_CSS) }))
        .route("/api/runs", get(api_runs))
        .route("/api/run", get(api_run))
        .route("/api/patch", get(api_patch))
        .route("/api/events", get(api_events))
        .route("/api/eval-instance", get(api_eval_instance))
        .route("/api/apply", post(api_apply))
        .route("/api/reject", post(api_reject))
        .route("/api/send-back", post(api_send_back))
        .fallback(|| async { (StatusCode::NOT_FOUND, Html("<h1>Not found</h1><p><a href=\"/\">All runs</a></p>")) })
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// The `Host` check (loopback) and the token (other hosts).
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if !app.allowed_hosts.is_empty() {
        let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if !app.allowed_hosts.iter().any(|a| a == host) {
            return (StatusCode::FORBIDDEN, format!("this review server answers only to {}", app.allowed_hosts[0]))
                .into_response();
        }
    }
    let Some(token) = &app.token else { return next.run(request).await };
    let query_token =
        request.uri().query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")).map(str::to_string));
    let cookie_ok = request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|c| c.to_str().ok())
        .flat_map(|c| c.split(';'))
        .any(|c| c.trim() == format!("frognano_review={token}"));
    if query_token.as_deref() == Some(token.as_str()) {
        let mut response = next.run(request).await;
        if let Ok(v) = format!("frognano_review={token}; Path=/; HttpOnly; SameSite=Strict").parse() {
            response.headers_mut().insert(header::SET_COOKIE, v);
        }
        return response;
    }
    if cookie_ok {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        Html(
            "<h1>Token needed</h1><p>This review server listens on a non-loopback address, so every \
             visit needs the token it printed when it started: open the URL it printed \
             (<code>…/?token=…</code>).</p>",
        ),
    )
        .into_response()
}

/// An API error: the status and a sentence for the page.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

/// Runs file and git work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("internal error: {e}"))))
}

impl App {
    fn found(&self, id: &str) -> Result<runs::Found, ApiError> {
        let path = runs::resolve(&self.root, id).map_err(|e| ApiError(StatusCode::NOT_FOUND, e))?;
        let id = runs::id_of(&self.root, &path);
        let job = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
        let kind = match (runs::classify(&path), job) {
            (Some(kind), _) => kind,
            (None, Some(_)) => runs::Kind::Solve,
            (None, None) => {
                return Err(ApiError(
                    StatusCode::NOT_FOUND,
                    format!(
                        "{} holds no run: no trajectory.json, patch.diff, run.json or summary.md (frognano solve), \
                         results.jsonl (frognano eval) or metrics.jsonl (frognano train)",
                        path.display()
                    ),
                ))
            }
        };
        Ok(runs::Found { id, path, kind })
    }

    /// The list, with runs this server started that have written nothing yet.
    fn rows(&self) -> Vec<runs::Row> {
        let mut rows = runs::list(&self.root);
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        for row in &mut rows {
            if let Some(Job::Running) = jobs.get(&row.id) {
                row.live = true;
            }
        }
        for (id, job) in jobs.iter() {
            if rows.iter().any(|r| &r.id == id) {
                continue;
            }
            let (live, problem) = match job {
                Job::Running => (true, None),
                Job::Failed(e) => (false, Some(format!("the continued run failed before its first step: {e}"))),
                Job::Finished => (false, Some("the run wrote nothing".to_string())),
            };
            rows.insert(
                0,
                runs::Row {
                    id: id.clone(),
                    kind: runs::Kind::Solve,
                    title: "(starting) a run sent back".to_string(),
                    model: None,
                    exit_reason: live.then(|| "running".to_string()),
                    steps: Some(0),
                    files: Vec::new(),
                    elapsed_sec: None,
                    started_unix: run_dir::unix_now(),
                    state: None,
                    live,
                    parent: None,
                    stats: None,
                    problem,
                },
            );
        }
        rows
    }

    fn job(&self, id: &str) -> Option<Job> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    fn decision(&self, action: &str, note: &str, outcome: String) -> Decision {
        Decision {
            at_unix: run_dir::unix_now(),
            by: self.config.reviewer.clone(),
            action: action.to_string(),
            note: note.to_string(),
            outcome,
        }
    }
}

async fn api_runs(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        Ok(Json(json!({
            "root": app.root.display().to_string(),
            "reviewer": app.config.reviewer,
            "runs": app.rows(),
        })))
    })
    .await
}

#[derive(Deserialize)]
struct IdQuery {
    id: String,
    #[serde(default)]
    page: Option<usize>,
    #[serde(default)]
    instance: Option<String>,
    #[serde(default)]
    attempt: Option<u64>,
}

async fn api_run(State(app): State<Arc<App>>, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let found = app.found(&q.id)?;
        let mut view = match found.kind {
            runs::Kind::Solve => runs::solve_view(&app.root, &found, &app.rows()),
            runs::Kind::Eval => runs::eval_view(&found),
            runs::Kind::Train => runs::train_view(&found),
        };
        match app.job(&found.id) {
            Some(Job::Running) => {
                view["live"] = json!(true);
                if view["problem"].is_string() {
                    view["problem"] = json!("the run has started; its first step is on the way");
                    view["starting"] = json!(true);
                }
            }
            Some(Job::Failed(e)) => view["problem"] = json!(format!("the continued run failed: {e}")),
            _ => {}
        }
        view["reviewer"] = json!(app.config.reviewer);
        Ok(Json(view))
    })
    .await
}

async fn api_patch(State(app): State<Arc<App>>, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let found = app.found(&q.id)?;
        let path = found.path.join(run_dir::PATCH);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => return Err(ApiError(StatusCode::NOT_FOUND, format!("{} has no patch.diff", found.id))),
        };
        let files = diff::parse(&bytes);
        Ok(Json(json!(diff::page(&files, q.page.unwrap_or(1), diff::LINES_PER_PAGE))))
    })
    .await
}

async fn api_eval_instance(State(app): State<Arc<App>>, Query(q): Query<IdQuery>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let found = app.found(&q.id)?;
        let instance = q.instance.ok_or_else(|| bad("which instance? (instance=…)"))?;
        runs::eval_instance_view(&found, &instance, q.attempt.unwrap_or(0))
            .map(Json)
            .map_err(|e| ApiError(StatusCode::NOT_FOUND, e))
    })
    .await
}

/// The trajectory file's size and modification time: changes when a checkpoint is written.
fn signature(dir: &Path) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(dir.join(run_dir::TRAJECTORY)).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// Server-sent events of a run in progress: `steps` (the steps not sent yet, and where the
/// run stands) at every checkpoint, then `done` once the trajectory is final (or `failed`).
async fn api_events(
    State(app): State<Arc<App>>,
    Query(q): Query<IdQuery>,
) -> Result<Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let found = app.found(&q.id)?;
    struct Watch {
        app: Arc<App>,
        found: runs::Found,
        sent: usize,
        last: Option<(u64, std::time::SystemTime)>,
        over: bool,
    }
    let start = Watch { app, found, sent: q.page.unwrap_or(0), last: None, over: false };
    let stream = futures_util::stream::unfold(start, |mut w| async move {
        if w.over {
            return None;
        }
        loop {
            let sig = signature(&w.found.path);
            let job = w.app.job(&w.found.id);
            if let Some(Job::Failed(e)) = &job {
                w.over = true;
                return Some((Ok(Event::default().event("failed").data(json!({ "error": e }).to_string())), w));
            }
            if sig.is_some() && sig != w.last {
                w.last = sig;
                let dir = w.found.path.clone();
                let Ok(Ok(t)) = tokio::task::spawn_blocking(move || runs::load_trajectory(&dir)).await else {
                    // Unreadable for a moment (another tool writing in place): try again.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                };
                let inherited = RunInfo::load(&w.found.path).ok().and_then(|i| i.parent).map_or(0, |p| p.steps);
                let views = runs::step_views(&t, inherited);
                let new: Vec<_> = views.into_iter().skip(w.sent).collect();
                w.sent += new.len();
                let live = t.partial || t.exit_reason == frognano_agent::trajectory::ExitReason::Running;
                let still_running = matches!(job, Some(Job::Running));
                let data = json!({
                    "steps": new,
                    "n_steps": t.n_steps,
                    "exit_reason": t.exit_reason.as_str(),
                    "live": live || still_running,
                })
                .to_string();
                if !live && !still_running {
                    w.over = true;
                    return Some((Ok(Event::default().event("done").data(data)), w));
                }
                return Some((Ok(Event::default().event("steps").data(data)), w));
            }
            if sig.is_some() && !matches!(job, Some(Job::Running)) {
                // Not changing and nobody here is writing it: finished, or stopped elsewhere.
                let dir = w.found.path.clone();
                if let Ok(Ok(t)) = tokio::task::spawn_blocking(move || runs::load_trajectory(&dir)).await {
                    if !t.partial {
                        w.over = true;
                        let data = json!({ "steps": [], "n_steps": t.n_steps, "exit_reason": t.exit_reason.as_str(), "live": false });
                        return Some((Ok(Event::default().event("done").data(data.to_string())), w));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

#[derive(Deserialize)]
struct DecisionBody {
    id: String,
    #[serde(default)]
    note: String,
}

fn solve_run(app: &App, id: &str) -> Result<runs::Found, ApiError> {
    let found = app.found(id)?;
    if found.kind != runs::Kind::Solve {
        return Err(bad(format!("{id} is not a frognano solve run; only those are applied, rejected or sent back")));
    }
    if let Some(Job::Running) = app.job(&found.id) {
        return Err(ApiError(StatusCode::CONFLICT, "the run is still going; decide once it has finished".to_string()));
    }
    if let Ok(t) = runs::load_trajectory(&found.path) {
        if t.partial {
            return Err(ApiError(
                StatusCode::CONFLICT,
                "the run is still going; decide once it has finished".to_string(),
            ));
        }
    }
    Ok(found)
}

async fn api_apply(State(app): State<Arc<App>>, Json(body): Json<DecisionBody>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let found = solve_run(&app, &body.id)?;
        match decisions::apply(&found.path) {
            Ok(repo) => {
                let d = app.decision("apply", &body.note, format!("applied to {}", repo.display()));
                decisions::record(&found.path, &d)
                    .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
                Ok(Json(json!({ "ok": true, "decision": d })))
            }
            Err(e) => {
                let reason = format!("{e:#}");
                // The refusal is on record too, so the list shows the patch no longer applies.
                let d = app.decision("apply_refused", &body.note, reason.clone());
                let _ = decisions::record(&found.path, &d);
                Err(ApiError(StatusCode::CONFLICT, reason))
            }
        }
    })
    .await
}

async fn api_reject(State(app): State<Arc<App>>, Json(body): Json<DecisionBody>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let found = solve_run(&app, &body.id)?;
        if body.note.trim().is_empty() {
            return Err(bad("say why in the note: the agent's author reads it"));
        }
        let d = app.decision("reject", body.note.trim(), "rejected".to_string());
        decisions::record(&found.path, &d)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
        Ok(Json(json!({ "ok": true, "decision": d })))
    })
    .await
}

#[derive(Deserialize)]
struct SendBackBody {
    id: String,
    comment: String,
}

/// A free directory name next to `parent` for the run that continues it.
fn continuation_dir(parent: &Path, instance: &str) -> PathBuf {
    let base = parent.parent().unwrap_or(parent);
    let safe: String =
        instance.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    let stem = format!("{safe}-{}", run_dir::unix_now());
    let mut dir = base.join(&stem);
    let mut n = 2;
    while dir.exists() {
        dir = base.join(format!("{stem}-{n}"));
        n += 1;
    }
    dir
}

async fn api_send_back(State(app): State<Arc<App>>, Json(body): Json<SendBackBody>) -> Result<Json<Value>, ApiError> {
    blocking(move || {
        let found = solve_run(&app, &body.id)?;
        let comment = body.comment.trim().to_string();
        if comment.is_empty() {
            return Err(bad("write the comment the agent should act on"));
        }
        let t = runs::load_trajectory(&found.path).map_err(|e| bad(format!("cannot continue this run: {e}")))?;
        let info = RunInfo::load(&found.path).map_err(|e| bad(format!("cannot continue this run: {e:#}")))?;
        let model = app.config.model.clone().unwrap_or_else(|| info.model_choice.clone());
        if matches!(model, ModelChoice::Replay(_)) {
            return Err(bad(
                "this run replayed a recorded trajectory, so there is no model to send it back to: start \
                 frognano review with --model MODEL or --endpoint URL --model NAME",
            ));
        }
        let dir = continuation_dir(&found.path, &t.instance_id);
        std::fs::create_dir_all(&dir).map_err(|e| {
            ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot create {}: {e}", dir.display()))
        })?;
        let dir = dir.canonicalize().unwrap_or(dir);
        let new_id = runs::id_of(&app.root, &dir);
        app.jobs.lock().unwrap_or_else(|e| e.into_inner()).insert(new_id.clone(), Job::Running);
        let d = app.decision("send_back", &comment, format!("continued in {new_id}"));
        decisions::record(&found.path, &d)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
        let config = SolveConfig {
            task: TaskInput::Continue { run: found.path.clone(), comment },
            model: model.clone(),
            output: Some(dir),
            instance_id: None,
            apply: false,
            ..app.config.continue_with.clone()
        };
        let worker = Arc::clone(&app);
        let job_id = new_id.clone();
        std::thread::spawn(move || {
            let cancel = AtomicBool::new(false);
            let result = match &worker.config.llm_factory {
                Some(factory) => factory(&model)
                    .and_then(|llm| frognano_agent::solve::solve_with_llm(&config, llm, &cancel, &mut |_| {})),
                None => frognano_agent::solve::solve_with_events(&config, &cancel, &mut |_| {}),
            };
            let job = match result {
                Ok(_) => Job::Finished,
                Err(e) => Job::Failed(format!("{e:#}")),
            };
            worker.jobs.lock().unwrap_or_else(|e| e.into_inner()).insert(job_id, job);
        });
        Ok(Json(json!({ "ok": true, "decision": d, "new_run": new_id })))
    })
    .await
}
