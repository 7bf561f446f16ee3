//! A real TCP proxy on loopback that a test can break in the ways a database
//! breaks: the way to make a real PostgreSQL unreachable, frozen or slow for
//! one service without touching it for the rest of the suite. Traffic is
//! forwarded byte for byte until [`Proxy::set`] says otherwise (see [`Mode`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic, open connections included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Byte for byte.
    Forward,
    /// A stopped server: open connections are dropped, and every new one is
    /// reset as soon as it is accepted, so a connect fails at once.
    Refuse,
    /// A network partition: open connections are dropped; new ones are
    /// accepted and left unanswered (the client waits for its own timeout),
    /// then dropped at the next change of mode.
    Blackhole,
    /// A frozen server (as under `SIGSTOP`): every connection stays open and
    /// nothing is forwarded, either way, until the mode changes; new ones
    /// are accepted and held. Back to [`Mode::Forward`], everything held
    /// flows again.
    Freeze,
    /// A slow network: every chunk read from either side is forwarded after
    /// this delay.
    Delay(Duration),
    /// A connection lost between a `COMMIT` and its answer: a client's
    /// `COMMIT` (PostgreSQL's simple query message) reaches the server, then
    /// the connection is dropped before the server's answer is passed back —
    /// the transaction commits and its client never learns it. Other traffic
    /// is forwarded.
    LoseCommitAnswers,
}

/// PostgreSQL's simple query message for `COMMIT`: `Q`, the length (4 + 7), the text and its NUL.
const COMMIT_QUERY: &[u8] = b"Q\x00\x00\x00\x0bCOMMIT\x00";

impl Mode {
    /// Whether open connections are dropped in this mode.
    fn drops(self) -> bool {
        matches!(self, Mode::Refuse | Mode::Blackhole)
    }
}

/// A forwarding proxy to `target`.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, _) = watch::channel(Mode::Forward);
        let accept_mode = mode.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(connection(inbound, target, accept_mode.subscribe()));
            }
        });
        Proxy { addr, mode }
    }

    /// Breaks (or mends) the traffic as `mode` says, from now on.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// A network partition ([`Mode::Blackhole`]).
    pub fn cut(&self) {
        self.set(Mode::Blackhole);
    }

    /// Forwards again. Connections that were dropped stay closed; frozen ones
    /// flow again.
    pub fn heal(&self) {
        self.set(Mode::Forward);
    }
}

/// One accepted connection, handled as the mode says.
async fn connection(inbound: TcpStream, target: SocketAddr, mut mode: watch::Receiver<Mode>) {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Forward | Mode::Delay(_) | Mode::LoseCommitAnswers => break,
            Mode::Refuse => {
                // A reset rather than an orderly close, as a closed port answers.
                let _ = inbound.set_zero_linger();
                return;
            }
            Mode::Blackhole => {
                let _ = mode.changed().await;
                return;
            }
            Mode::Freeze => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
        }
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let (inbound_read, inbound_write) = inbound.into_split();
    let (outbound_read, outbound_write) = outbound.into_split();
    // Either direction ending ends the connection. While commit answers are lost, a `COMMIT`
    // passed on to the server makes the server's next bytes (its answer, sent once the commit is
    // done) end the connection instead of being passed back.
    let swallow = AtomicBool::new(false);
    tokio::select! {
        _ = pump(inbound_read, outbound_write, mode.clone(), Commits::Watch(&swallow)) => {}
        _ = pump(outbound_read, inbound_write, mode, Commits::Answer(&swallow)) => {}
    }
}

/// A pump's part in losing commit answers ([`Mode::LoseCommitAnswers`]).
#[derive(Clone, Copy)]
enum Commits<'a> {
    /// From the client: a `COMMIT` sets the flag.
    Watch(&'a AtomicBool),
    /// From the server: with the flag set, the answer ends the connection.
    Answer(&'a AtomicBool),
}

/// Copies chunks from `from` to `to`, holding or delaying each as the mode
/// says when it is read, and stops when the mode drops connections.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    commits: Commits<'_>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = mode.wait_for(|mode| mode.drops()) => return,
        };
        let length = match read {
            Ok(0) | Err(_) => return,
            Ok(length) => length,
        };
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Forward => break,
                Mode::LoseCommitAnswers => {
                    match commits {
                        Commits::Watch(swallow) => {
                            let chunk = &buffer[..length];
                            if chunk
                                .windows(COMMIT_QUERY.len())
                                .any(|window| window == COMMIT_QUERY)
                            {
                                swallow.store(true, Ordering::SeqCst);
                            }
                        }
                        Commits::Answer(swallow) if swallow.load(Ordering::SeqCst) => return,
                        Commits::Answer(_) => {}
                    }
                    break;
                }
                Mode::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Mode::Freeze => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
                Mode::Refuse | Mode::Blackhole => return,
            }
        }
        if to.write_all(&buffer[..length]).await.is_err() {
            return;
        }
    }
}
