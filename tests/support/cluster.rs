//! A PostgreSQL server of the test's own: `initdb` into a temporary directory, `pg_ctl` to start
//! it on a free loopback port, and to stop it and start it again while replicas use it. The
//! machine's shared server (`DATABASE_URL`) cannot be stopped without failing every other test;
//! this one can.
//!
//! The binaries are found with `pg_config --bindir` (Debian's `postgresql` package puts them in
//! `/usr/lib/postgresql/<major>/bin`). PostgreSQL refuses to run as root, so as root the server
//! runs as the `postgres` user (`runuser`). Without the binaries the test is skipped — a failure
//! instead when `CAPGATE_REQUIRE_POSTGRES=1`, as for `DATABASE_URL`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};

/// A private PostgreSQL server, stopped and removed on drop.
pub struct Cluster {
    bin: PathBuf,
    /// Holds the data directory and the socket; removed on drop.
    dir: tempfile::TempDir,
    pub port: u16,
    as_postgres: bool,
}

impl Cluster {
    /// Initialises and starts a server with trust authentication on `127.0.0.1:<free port>`;
    /// `None` (after saying why) when PostgreSQL's server binaries are not installed.
    pub fn start() -> Option<Cluster> {
        let Some(bin) = server_binaries() else {
            if std::env::var("CAPGATE_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!("CAPGATE_REQUIRE_POSTGRES=1 but PostgreSQL's server binaries (pg_config --bindir) are missing");
            }
            eprintln!("skipped: needs PostgreSQL's server binaries (initdb, pg_ctl)");
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("capgate-cluster-")
            .tempdir()
            .expect("a temporary directory");
        let as_postgres = is_root();
        if as_postgres {
            // The server's user must own its directories; the test (root) can read them anyway.
            let chowned = Command::new("chown")
                .args(["postgres:postgres", &dir.path().display().to_string()])
                .status()
                .expect("run chown");
            assert!(chowned.success(), "chown the cluster directory to postgres");
        }
        let port = free_port();
        let cluster = Cluster {
            bin,
            dir,
            port,
            as_postgres,
        };
        let data = cluster.data().display().to_string();
        let initialised = cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        assert!(
            initialised.status.success(),
            "initdb failed:\n{}",
            text(&initialised)
        );
        cluster.start_again();
        Some(cluster)
    }

    /// The URL of database `postgres` on it.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let data = self.data().display().to_string();
        let log = self.dir.path().join("server.log").display().to_string();
        let started = self.run(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
        );
        assert!(
            started.status.success(),
            "pg_ctl start failed:\n{}\n{}",
            text(&started),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Stops the server the way a crash or an operator's fast shutdown does: every connection is
    /// dropped at once.
    pub fn stop(&self) {
        let data = self.data().display().to_string();
        let stopped = self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]);
        assert!(
            stopped.status.success(),
            "pg_ctl stop failed:\n{}",
            text(&stopped)
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|error| panic!("run {}: {error}", program.display()))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data().display().to_string();
        // Never a panic in drop; a server that is already stopped says so and that is fine.
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
    }
}

fn server_binaries() -> Option<PathBuf> {
    let output = Command::new("pg_config").arg("--bindir").output().ok()?;
    let reported = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    // Debian's pg_config reports /usr/bin, where only the client wrappers are; the server's
    // binaries are under /usr/lib/postgresql/<major>/bin.
    if reported.join("initdb").exists() {
        return Some(reported);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| output.stdout.trim_ascii() == b"0")
}

/// A port nobody listens on now (the kernel's pick, released at once).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
