//! A TCP proxy a test owns, to cut a process off from a server the way a
//! network partition does: after [`TcpProxy::blackhole`] no byte moves in
//! either direction, yet every socket stays open, so neither side sees a
//! reset or a close (only timeouts can tell).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug)]
pub struct TcpProxy {
    pub address: SocketAddr,
    blackholed: Arc<watch::Sender<bool>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards each connection to
    /// `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let blackholed = Arc::new(watch::Sender::new(false));
        let state = blackholed.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, upstream, state.subscribe()));
            }
        });
        Self {
            address,
            blackholed,
            accepting,
        }
    }

    /// From now on nothing is forwarded; new connections are accepted and
    /// held without a word.
    pub fn blackhole(&self) {
        self.blackholed.send_replace(true);
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url_through(&self, url: &str) -> String {
        let mut url = url::Url::parse(url).unwrap();
        url.set_host(Some(&self.address.ip().to_string())).unwrap();
        url.set_port(Some(self.address.port())).unwrap();
        url.to_string()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accepting.abort();
        // Held connections end with their tasks: wake them to close.
        self.blackholed.send_replace(true);
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, blackholed: watch::Receiver<bool>) {
    if *blackholed.borrow() {
        hold(client, blackholed).await;
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        copy_until_blackholed(client_read, server_write, blackholed.clone()),
        copy_until_blackholed(server_read, client_write, blackholed),
    );
}

/// Copies until either side closes; once blackholed, keeps both halves open
/// and silent until the proxy is dropped.
async fn copy_until_blackholed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut blackholed: watch::Receiver<bool>,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buffer) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if *blackholed.borrow() {
                    break;
                }
                if to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
            changed = blackholed.changed() => {
                if changed.is_err() || *blackholed.borrow() {
                    break;
                }
            }
        }
    }
    hold((from, to), blackholed).await;
}

/// Keeps `sockets` open, reading nothing, until the proxy goes away.
async fn hold<T>(sockets: T, mut blackholed: watch::Receiver<bool>) {
    // The sender lives in the proxy: its drop ends the wait.
    while blackholed.changed().await.is_ok() {}
    drop(sockets);
}
