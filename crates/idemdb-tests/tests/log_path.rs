//! The log belongs to the database, not to the spelling of its path: opened through a symbolic
//! link (to the file or to its directory), a relative path or a bind mount, a database killed
//! with acknowledged outcomes in its log finds that log and replays it. And an I/O error on the
//! log (read-only, a directory in its place, a log that cannot be created) names the log and
//! its path.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::worker::{Acks, Worker, open_worker_db};
use idemdb::{Error, IdemDb};

/// A database at `dir/real/shop.idemdb`, killed with outcomes in its log.
fn killed(dir: &Path) -> (PathBuf, Acks) {
    let real = fs::canonicalize(dir).unwrap().join("real");
    fs::create_dir(&real).unwrap();
    let path = real.join("shop.idemdb");
    let mut acks = Acks::default();
    let mut worker = Worker::new();
    // No checkpoint while it runs, by age or by the log filling up (40 operations per thread
    // stay far below its first MiB): its outcomes are in the log, however fast the machine.
    worker.checkpoint_ms = Some(3_600_000);
    worker.ops_per_thread = Some(40);
    worker.run_and_kill(&path, "r1", 150, &mut acks);
    assert!(acks.lines > 0);
    (path, acks)
}

/// Opening `through` finds the log beside `path`: every acknowledged outcome is there, and no
/// second log appeared beside the spelling.
fn opens_with_its_log(through: &Path, path: &Path, acks: &Acks) {
    let db = open_worker_db(through).unwrap_or_else(|e| panic!("{}: {e}", through.display()));
    assert!(db.stats().replayed_frames > 0, "nothing replayed");
    acks.check_outcomes(&db);
    acks.check_tokens(&db, "probe");
    drop(db);
    let mut spelled = through.as_os_str().to_owned();
    spelled.push("-wal");
    let spelled = PathBuf::from(spelled);
    let mut real = path.as_os_str().to_owned();
    real.push("-wal");
    // Unless the spelling's directory is the file's own (a bind mount shows it twice), no log
    // appeared beside the spelling.
    let dir_id = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(p.parent().unwrap()).unwrap();
        (m.dev(), m.ino())
    };
    if dir_id(&spelled) != dir_id(path) {
        assert!(!spelled.exists(), "a log was created beside the link");
    }
    assert!(PathBuf::from(real).exists());
}

#[test]
fn a_symlink_to_the_database_file_finds_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let (path, acks) = killed(dir.path());
    let link = dir.path().join("link.idemdb");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    opens_with_its_log(&link, &path, &acks);
}

#[test]
fn a_symlinked_directory_finds_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let (path, acks) = killed(dir.path());
    let linked = dir.path().join("linked");
    std::os::unix::fs::symlink(path.parent().unwrap(), &linked).unwrap();
    opens_with_its_log(&linked.join("shop.idemdb"), &path, &acks);
}

#[test]
fn a_relative_path_finds_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let (path, acks) = killed(dir.path());
    // Relative to the working directory, through `..` as far up as it takes.
    let cwd = std::env::current_dir().unwrap();
    let mut relative = PathBuf::new();
    for _ in cwd.components().skip(1) {
        relative.push("..");
    }
    relative.push(path.strip_prefix("/").unwrap());
    assert!(relative.is_relative());
    opens_with_its_log(&relative, &path, &acks);
}

/// A database created through a dangling link is created where the link points, with its log.
#[test]
fn a_database_created_through_a_dangling_link_is_created_at_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.idemdb");
    let link = dir.path().join("link.idemdb");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    drop(IdemDb::open(&link).unwrap());
    assert!(target.exists());
    assert!(dir.path().join("target.idemdb-wal").exists());
    assert!(!dir.path().join("link.idemdb-wal").exists());
}

/// Bind mounts need privileges (CAP_SYS_ADMIN): as root, as CI runs, this mounts the
/// database's directory a second time. Elsewhere it says so and checks nothing.
#[test]
fn a_bind_mount_finds_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let (path, acks) = killed(dir.path());
    let mount = dir.path().join("mounted");
    fs::create_dir(&mount).unwrap();
    let status = Command::new("mount")
        .arg("--bind")
        .arg(path.parent().unwrap())
        .arg(&mount)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("a_bind_mount_finds_its_log: cannot bind-mount here (not root?); not checked");
        return;
    }
    let through = mount.join("shop.idemdb");
    let result = std::panic::catch_unwind(|| opens_with_its_log(&through, &path, &acks));
    let _ = Command::new("umount").arg(&mount).status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Whether this process runs as root: files it creates belong to uid 0.
fn is_root(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(dir).unwrap().uid() == 0
}

/// Makes `path` unwritable even for root: `chattr +i` (immutable). Returns false where that
/// is not possible (another filesystem, no chattr).
fn make_immutable(path: &Path, on: bool) -> bool {
    Command::new("chattr")
        .arg(if on { "+i" } else { "-i" })
        .arg(path)
        .status()
        .is_ok_and(|s| s.success())
}

fn log_io(path: &Path) -> (Option<PathBuf>, &'static str, String) {
    match open_worker_db(path) {
        Err(e @ Error::LogIo { .. }) => {
            let text = e.to_string();
            let Error::LogIo { log, action, .. } = e else {
                unreachable!()
            };
            (log, action, text)
        }
        Err(e) => panic!("expected LogIo, got {e}"),
        Ok(_) => panic!("expected LogIo, the open succeeded"),
    }
}

#[test]
fn a_read_only_log_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (path, acks) = killed(dir.path());
    let log = path.with_file_name("shop.idemdb-wal");
    let restore: Box<dyn Fn()> = if is_root(dir.path()) {
        if !make_immutable(&log, true) {
            eprintln!("a_read_only_log_is_an_io_error_naming_it: no chattr +i here; not checked");
            return;
        }
        Box::new(|| assert!(make_immutable(&log, false)))
    } else {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&log, fs::Permissions::from_mode(0o444)).unwrap();
        Box::new(|| fs::set_permissions(&log, fs::Permissions::from_mode(0o644)).unwrap())
    };
    let (named, action, text) = log_io(&path);
    restore();
    assert_eq!(named.as_deref(), Some(log.as_path()));
    assert_eq!(action, "open");
    assert!(text.contains(&log.display().to_string()), "{text}");
    assert!(text.contains("write-ahead log"), "{text}");
    // Writable again: nothing was lost.
    let db = open_worker_db(&path).unwrap();
    acks.check_outcomes(&db);
}

#[test]
fn a_directory_in_place_of_the_log_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = fs::canonicalize(dir.path()).unwrap().join("shop.idemdb");
    drop(IdemDb::open(&path).unwrap());
    let log = path.with_file_name("shop.idemdb-wal");
    fs::remove_file(&log).unwrap();
    fs::create_dir(&log).unwrap();
    let (named, _, text) = log_io(&path);
    assert_eq!(named.as_deref(), Some(log.as_path()));
    assert!(text.contains(&log.display().to_string()), "{text}");
    assert!(text.to_lowercase().contains("directory"), "{text}");
}

#[test]
fn a_log_that_cannot_be_created_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = fs::canonicalize(dir.path()).unwrap().join("home");
    fs::create_dir(&home).unwrap();
    let path = home.join("shop.idemdb");
    drop(IdemDb::open(&path).unwrap());
    let log = home.join("shop.idemdb-wal");
    // Closed cleanly: a missing log is created afresh, if the directory lets it.
    fs::remove_file(&log).unwrap();
    let restore: Box<dyn Fn()> = if is_root(dir.path()) {
        if !make_immutable(&home, true) {
            eprintln!("a_log_that_cannot_be_created...: no chattr +i here; not checked");
            return;
        }
        Box::new(|| assert!(make_immutable(&home, false)))
    } else {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&home, fs::Permissions::from_mode(0o555)).unwrap();
        Box::new(|| fs::set_permissions(&home, fs::Permissions::from_mode(0o755)).unwrap())
    };
    let (named, action, text) = log_io(&path);
    restore();
    assert_eq!(named.as_deref(), Some(log.as_path()));
    assert_eq!(action, "create");
    assert!(text.contains(&log.display().to_string()), "{text}");
    drop(IdemDb::open(&path).unwrap());
    assert!(log.exists());
}
