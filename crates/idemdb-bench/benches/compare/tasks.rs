//! The async cells' callers: tasks on one current-thread tokio runtime, whose one thread lives
//! across criterion's iterations as a [`Pool`](crate::pool::Pool)'s threads do. Only the
//! engines with an async API are here: idemdb (`reserve_async` / `complete_async`), Redis (a
//! tokio connection per task) and the PostgreSQL table (a tokio-postgres connection per task).

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemdb::IdemDb;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinSet;

use crate::engines::Kind;
use crate::idem::{IdemTask, open_idemdb};
use crate::pool::{Callers, Command, Runs, Spent};
use crate::postgres::{PgTask, Postgres};
use crate::redis::{Redis, RedisTask};
use crate::shared::callers::Done;
use crate::shared::keys::fresh_id;
use crate::shared::nanos;

/// An engine opened for the async cells, as [`Kind::open`] opens it for the sync ones.
#[derive(Clone)]
pub enum TaskEngine {
    Idem(Arc<IdemDb>),
    Redis(Arc<Redis>),
    Postgres(Arc<Postgres>),
}

/// One task's handle on a [`TaskEngine`].
enum TaskSession {
    Idem(IdemTask),
    Redis(RedisTask),
    Postgres(PgTask),
}

impl TaskEngine {
    /// Opens `kind` on a fresh file in `dir` (Redis: a server; PostgreSQL: a fresh schema).
    /// Call on the main thread (see `redis.rs`).
    pub fn open(kind: Kind, dir: &Path) -> TaskEngine {
        match kind {
            Kind::Idem => TaskEngine::Idem(open_idemdb(dir)),
            Kind::Redis => TaskEngine::Redis(Arc::new(Redis::open(dir))),
            Kind::Postgres => TaskEngine::Postgres(Arc::new(Postgres::open())),
            other => panic!("{other:?} has no async API"),
        }
    }

    /// One task's session; await it on the runtime that will run the task.
    async fn session(&self) -> TaskSession {
        match self {
            TaskEngine::Idem(db) => TaskSession::Idem(IdemTask::new(db)),
            TaskEngine::Redis(redis) => TaskSession::Redis(redis.task_session().await),
            TaskEngine::Postgres(pg) => TaskSession::Postgres(pg.task_session().await),
        }
    }

    /// As [`Engine::commits`](crate::interface::Engine::commits).
    fn commits(&self) -> Option<u64> {
        match self {
            TaskEngine::Idem(db) => Some(db.stats().commits),
            TaskEngine::Redis(_) | TaskEngine::Postgres(_) => None,
        }
    }

    /// As [`Engine::server_pids`](crate::interface::Engine::server_pids).
    fn server_pids(&self) -> Vec<u32> {
        use crate::interface::Engine as _;
        match self {
            TaskEngine::Idem(_) => Vec::new(),
            TaskEngine::Redis(redis) => redis.server_pids(),
            TaskEngine::Postgres(pg) => pg.server_pids(),
        }
    }
}

impl TaskSession {
    /// Reserve + complete of key `id`, which must be fresh.
    async fn lifecycle(&mut self, id: u64) {
        match self {
            TaskSession::Idem(s) => s.lifecycle(id).await,
            TaskSession::Redis(s) => s.lifecycle(id).await,
            TaskSession::Postgres(s) => s.lifecycle(id).await,
        }
    }
}

/// `tasks` callers, each a task with its own session, on one runtime thread.
pub struct Tasks {
    runs: Runs<UnboundedSender<u64>>,
    thread: Option<JoinHandle<()>>,
}

impl Tasks {
    /// Starts the runtime's thread and returns once every task's session is connected.
    pub fn new(engine: &TaskEngine, tasks: usize) -> Tasks {
        let (done_tx, done) = channel();
        let (ready_tx, ready) = channel();
        let (commands, receivers): (Vec<_>, Vec<_>) =
            (0..tasks).map(|_| unbounded_channel()).unzip();
        let on_thread = engine.clone();
        let thread = std::thread::Builder::new()
            .name("caller-tasks".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on(serve(on_thread, receivers, done_tx, ready_tx));
            })
            .expect("spawn the runtime's thread");
        ready.recv().expect("every task's session connected");
        let counted = engine.clone();
        Tasks {
            // Every session is connected: a server's backends for them exist now.
            runs: Runs::new(
                commands,
                done,
                engine.server_pids(),
                Box::new(move || counted.commits()),
            ),
            thread: Some(thread),
        }
    }
}

/// Connects a session per task and runs the tasks until their commands end. A task's panic
/// is re-raised here: the runtime then drops the other tasks, and with them every sender of
/// `done`, so that the bench's thread does not wait for them forever.
async fn serve(
    engine: TaskEngine,
    commands: Vec<UnboundedReceiver<u64>>,
    done: Sender<Done>,
    ready: Sender<()>,
) {
    let mut callers = JoinSet::new();
    for rx in commands {
        let session = engine.session().await;
        callers.spawn(caller(session, rx, done.clone()));
    }
    drop((engine, done));
    let _ = ready.send(());
    while let Some(joined) = callers.join_next().await {
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// One task: for each command `n`, `n` lifecycles of fresh keys, timed as a pool's thread
/// times them (a latency includes the wait for this runtime's thread, as a caller sees it).
async fn caller(
    mut session: TaskSession,
    mut commands: UnboundedReceiver<u64>,
    done: Sender<Done>,
) {
    while let Some(n) = commands.recv().await {
        let mut latencies = Vec::with_capacity(n as usize);
        let start = Instant::now();
        let mut before = start;
        for _ in 0..n {
            session.lifecycle(fresh_id()).await;
            let now = Instant::now();
            latencies.push(nanos(now - before));
            before = now;
        }
        let report = Done {
            start,
            end: before,
            latencies,
        };
        if done.send(report).is_err() {
            break;
        }
    }
}

impl Command for UnboundedSender<u64> {
    fn start(&self, n: u64) {
        self.send(n).expect("task alive");
    }
}

impl Callers for Tasks {
    /// Every task runs `per_task` lifecycles: see [`Runs::run`].
    fn run(&mut self, per_task: u64, latencies: &mut Vec<u64>) -> Duration {
        self.runs.run(per_task, latencies)
    }

    fn spent(&self) -> Spent {
        self.runs.spent()
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        // The tasks end when their commands do, then the runtime and its thread.
        self.runs.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
