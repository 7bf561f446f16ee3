//! A real TCP proxy on loopback that a test can cut: the way to make a real
//! PostgreSQL unreachable for one service without stopping it for the rest of
//! the suite. Traffic is forwarded byte for byte; `cut` drops every open
//! connection and then either refuses or black-holes new ones.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const FORWARD: u8 = 0;
const BLACKHOLE: u8 = 1;

/// A forwarding proxy to `target`.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    generation: watch::Sender<u64>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let mode = Arc::new(AtomicU8::new(FORWARD));
        let (generation, _) = watch::channel(0u64);
        let accept_mode = mode.clone();
        let accept_generation = generation.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                let mode = accept_mode.clone();
                let mut cut = accept_generation.subscribe();
                tokio::spawn(async move {
                    if mode.load(Ordering::SeqCst) == BLACKHOLE {
                        // Accept and say nothing: the client waits until its own timeout.
                        let _ = cut.changed().await;
                        drop(inbound);
                        return;
                    }
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut inbound_read, mut inbound_write) = inbound.into_split();
                    let (mut outbound_read, mut outbound_write) = outbound.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut inbound_read, &mut outbound_write) => {}
                        _ = tokio::io::copy(&mut outbound_read, &mut inbound_write) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            mode,
            generation,
        }
    }

    /// Drops every open connection; new ones are accepted and then left
    /// unanswered (a network partition, not a refusal).
    pub fn cut(&self) {
        self.mode.store(BLACKHOLE, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Forwards again (open connections that were cut stay closed).
    pub fn heal(&self) {
        self.mode.store(FORWARD, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
}
