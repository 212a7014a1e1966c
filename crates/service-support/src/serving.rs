//! The opening every service's start-up shares: its listener bound (and the
//! address it got, for port 0), and the root of its cancellation tree,
//! cancelled once the shutdown signal comes.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr`; the error names it.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// The address `listener` is bound to (the port it got, for port 0).
pub fn local_addr(listener: &TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .expect("a bound TCP listener has a local address")
}

/// A token cancelled once `shutdown` completes: the root every task of the
/// service watches.
pub fn cancelled_by(shutdown: impl Future<Output = ()> + Send + 'static) -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });
    token
}
