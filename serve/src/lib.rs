//! `draftc serve`: an OpenAI-compatible HTTP server over the runtime's
//! continuous-batching [`draftc_runtime::engine::Engine`]. The HTTP stack
//! (axum on tokio) lives here only; the engine runs on a thread of its own
//! that owns the device, and handlers reach it through a bounded channel.
//!
//! | file | owns |
//! | --- | --- |
//! | `args.rs` | the command line |
//! | `state.rs` | health, admission (queue places), what handlers and the engine share |
//! | `worker.rs` | the engine thread: loading, warm-up, rounds, cancellation of gone clients |
//! | `routes.rs` | the routes, streaming and non-streaming responses |
//! | `request.rs` | an OpenAI body parsed and checked into prompt ids and sampling settings |
//! | `text.rs` | token ids into whole-UTF-8 text pieces, stop strings held back and cut |
//! | `error.rs` | OpenAI-shaped errors and their statuses |
//! | `metrics.rs` | Prometheus text |

pub mod args;
pub mod error;
pub mod metrics;
pub mod request;
pub mod routes;
pub mod state;
pub mod text;
pub mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use draftc_runtime::model::ConvertedModel;

use args::ServeArgs;
use state::{Health, Limits, Shared};

/// Runs the server until SIGTERM / SIGINT and its drain.
pub fn run(args: ServeArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: ServeArgs) -> Result<(), String> {
    if args.max_running == 0 {
        return Err("--max-running must be at least 1".into());
    }
    if args.max_model_len < 2 {
        return Err("--max-model-len must be at least 2".into());
    }
    if !(args.drain_timeout >= 0.0 && args.drain_timeout.is_finite()) {
        return Err("--drain-timeout must be a number of seconds >= 0".into());
    }
    draftc_runtime::device::Backend::parse(&args.backend)?;
    draftc_runtime::device::check_dtype(&args.dtype)?;
    if !matches!(args.speculate.as_str(), "auto" | "fixed") {
        return Err(format!(
            "--speculate {}: expected `auto` or `fixed`",
            args.speculate
        ));
    }
    let dir: PathBuf = draftc_runtime::cli::generate::model_dir(args.model.as_deref(), false)?;
    let model =
        Arc::new(ConvertedModel::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?);
    let max_model_len = args
        .max_model_len
        .min(model.config.max_position_embeddings.max(2));
    let served = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_model_name(&dir));
    let limits = Limits {
        served_model_name: served.clone(),
        max_queued: args.max_queued,
        max_model_len,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_bytes,
    };
    let shared = Arc::new(Shared::new(limits, model.clone()));
    let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(args.max_queued + args.max_running + 1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    let addr = format!("{}:{}", args.host, args.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "draftc serve: http://{local} (model `{served}`, {}, {} slots of {max_model_len} tokens; loading …)",
        if args.no_spec {
            "no drafter".to_string()
        } else {
            format!("drafter {}", args.drafter)
        },
        args.max_running
    );
    let engine_args = ServeArgs {
        max_model_len,
        ..args.clone()
    };
    let engine_shared = shared.clone();
    std::thread::Builder::new()
        .name("draftc-engine".into())
        .spawn(move || {
            worker::run(engine_args, model, engine_shared.clone(), jobs_rx);
            // Its job channel closes when the server stops (after a
            // drain): that is no failure. Ending otherwise is one.
            if !matches!(engine_shared.health(), Health::Failed | Health::Draining) {
                engine_shared.fail("the engine thread ended".into());
            }
        })
        .map_err(|e| e.to_string())?;
    let app = routes::router(routes::App {
        shared: shared.clone(),
        jobs: jobs_tx,
    });
    let drain = Duration::from_secs_f64(args.drain_timeout);
    rt.block_on(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(drained(shared, drain))
            .await
    })
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// The name clients send for the model in `dir`: the directory's name, or
/// its parent's when the directory is named after a dtype (`draftc fetch`
/// converts into `…/smollm2-135m-instruct/float32`).
pub fn default_model_name(dir: &std::path::Path) -> String {
    let name = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    match name(dir) {
        Some(n)
            if ["float32", "float16", "bfloat16", "f32", "f16", "bf16"].contains(&n.as_str()) =>
        {
            dir.parent().and_then(name).unwrap_or(n)
        }
        Some(n) => n,
        None => "draftc".into(),
    }
}

/// Resolves once SIGTERM or SIGINT came and the running requests finished
/// (or `drain` passed); meanwhile `/health` says 503 and new work is
/// refused. A hard exit follows shortly after, so a connection that does
/// not close cannot hold the process.
async fn drained(shared: Arc<Shared>, drain: Duration) {
    signal().await;
    shared.set_health(Health::Draining);
    eprintln!(
        "draftc serve: draining (up to {:.0} s) …",
        drain.as_secs_f64()
    );
    let deadline = Instant::now() + drain;
    loop {
        let busy = shared.in_flight.load(Ordering::SeqCst) > 0
            || shared.gauges.queued.load(Ordering::SeqCst) > 0
            || shared.gauges.running.load(Ordering::SeqCst) > 0;
        if !busy || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("draftc serve: stopped");
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(2));
        std::process::exit(0);
    });
}

async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn the_default_model_name_skips_a_dtype_directory() {
        let name = super::default_model_name;
        assert_eq!(
            name(Path::new("/c/smollm2-135m-instruct/float32")),
            "smollm2-135m-instruct"
        );
        assert_eq!(name(Path::new("models/my-llama")), "my-llama");
        assert_eq!(name(Path::new("/")), "draftc");
    }
}
