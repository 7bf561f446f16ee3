//! `capgate serve` as a child process: the real binary, its flags, its
//! signals and its exit code.
//!
//! Each server listens on `127.0.0.1:0` and logs JSON lines; the test learns
//! the port from the `capgate serving` line, so no port is ever guessed (and
//! raced for). Every log line is kept, and shown when the test fails. The
//! process is killed when its [`Serve`] is dropped, so a failing test leaves
//! nothing running.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

/// How long a server may take to start listening.
const START_WITHIN: Duration = Duration::from_secs(15);

/// A running `capgate serve`.
pub struct Serve {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    /// Starts `capgate serve --listen 127.0.0.1:0 --log-format json ARGS`
    /// and returns once it listens.
    pub async fn start(args: &[&str]) -> Serve {
        Serve::start_with_env(args, &[]).await
    }

    /// The README's main command: the example policy and catalog, on an SQLite file in `dir`,
    /// with the example's static key unset (as on a newcomer's laptop).
    pub async fn start_example(dir: &std::path::Path) -> Serve {
        let url = format!("sqlite://{}", dir.join("capgate.db").display());
        Serve::start_with_env(
            &[
                "--database-url",
                &url,
                "--policy",
                "examples/policy.yaml",
                "--catalog",
                "examples/catalog.yaml",
            ],
            &[("NIGHTLY_RUNNER_KEY", "")],
        )
        .await
    }

    /// As [`Serve::start`], with environment variables set for the process
    /// (`CAPGATE_LOG` among them, which is otherwise `info`).
    pub async fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Serve {
        Serve::launch(Command::new(env!("CARGO_BIN_EXE_capgate")), args, env).await
    }

    /// As [`Serve::start_with_env`], with the process's open-file limit (`ulimit -n`) set to
    /// `limit` by a shell that then execs the binary, so that the pid is still the server's.
    pub async fn start_with_open_file_limit(args: &[&str], limit: u32, env: &[(&str, &str)]) -> Serve {
        let mut shell = Command::new("sh");
        shell.args([
            "-c",
            &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
            env!("CARGO_BIN_EXE_capgate"),
        ]);
        Serve::launch(shell, args, env).await
    }

    /// Runs `command serve --listen 127.0.0.1:0 --log-format json ARGS`.
    async fn launch(mut command: Command, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut child = command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .env("CAPGATE_LOG", "info")
            .envs(env.iter().copied())
            .env_remove("CAPGATE_DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn capgate serve");
        let stderr = child.stderr.take().expect("piped standard error");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (sender, mut lines) = tokio::sync::mpsc::unbounded_channel();
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(line.clone());
                // The test stops listening once the server is up.
                let _ = sender.send(line);
            }
        });
        // The guard exists before anything can fail, so that a failure below
        // still kills the process.
        let mut serve = Serve {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            logs,
        };
        let deadline = tokio::time::Instant::now() + START_WITHIN;
        loop {
            match tokio::time::timeout_at(deadline, lines.recv()).await {
                Ok(Some(line)) => {
                    if let Some(addr) = listening_on(&line) {
                        serve.addr = addr;
                        return serve;
                    }
                }
                Ok(None) => panic!(
                    "capgate serve {args:?} ended before it listened:\n{}",
                    serve.logs()
                ),
                Err(_) => panic!(
                    "capgate serve {args:?} did not listen within {START_WITHIN:?}:\n{}",
                    serve.logs()
                ),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A plaintext channel to it.
    pub async fn channel(&self) -> Channel {
        super::client::connect(self.addr).await
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {} failed", self.pid());
    }

    /// Kills it with SIGKILL, as the kernel's OOM killer or a node failure would: no drain, no
    /// flush. Returns once it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to end; panics (and kills it) after `within`.
    pub async fn wait(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the child") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "capgate serve did not end within {within:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything it logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "── capgate serve (pid {}) logged ──\n{}",
                self.child.id(),
                self.logs()
            );
        }
    }
}

/// The first address of the `capgate serving` log line, if this is it.
fn listening_on(line: &str) -> Option<SocketAddr> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = value.get("fields")?;
    if fields.get("message")?.as_str()? != "capgate serving" {
        return None;
    }
    fields
        .get("addresses")?
        .as_str()?
        .split(", ")
        .next()?
        .parse()
        .ok()
}
