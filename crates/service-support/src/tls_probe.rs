//! Whether a listener speaks TLS, asked the only way that cannot be
//! mistaken: send a TLS ClientHello and see whether a TLS record comes back.
//!
//! A plaintext Kafka client at a TLS listener sees only "connection closed
//! by peer" during its first request, which is also what a load balancer
//! with no broker behind it does; librdkafka retries for ever. The probe
//! tells the two apart, so that start-up can stop and say which setting is
//! wrong. A Kafka broker reads the hello as a request of ~369 MB, more than
//! any broker accepts, and closes or waits: never a TLS answer.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The first of `servers` (librdkafka's `bootstrap.servers`: `host:port`,
/// optionally `PROTOCOL://host:port`, comma-separated) that answers a TLS
/// ClientHello with a TLS record, within `timeout` per address. Blocking.
pub fn first_tls_listener(servers: &str, timeout: Duration) -> Option<String> {
    servers
        .split(',')
        .map(|server| server.trim())
        .map(|server| {
            server
                .split_once("://")
                .map_or(server, |(_, address)| address)
        })
        .filter(|server| !server.is_empty())
        .find(|server| speaks_tls(server, timeout))
        .map(str::to_owned)
}

/// Whether `server` (`host:port`) answers a ClientHello with a TLS record.
pub fn speaks_tls(server: &str, timeout: Duration) -> bool {
    let Ok(addresses) = server.to_socket_addrs() else {
        return false;
    };
    let host = server.rsplit_once(':').map_or(server, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    addresses
        .take(4)
        .any(|address| answer_is_tls(&address, host, timeout).unwrap_or(false))
}

fn answer_is_tls(
    address: &std::net::SocketAddr,
    host: &str,
    timeout: Duration,
) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect_timeout(address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(&client_hello(host))?;
    let mut header = [0u8; 3];
    stream.read_exact(&mut header)?;
    Ok(is_tls_record(header))
}

/// A TLS record header: a handshake (a ServerHello) or an alert (a server
/// that dislikes the offer still answers in TLS), protocol major version 3.
fn is_tls_record(header: [u8; 3]) -> bool {
    matches!(header[0], HANDSHAKE | ALERT) && header[1] == 3 && header[2] <= 4
}

const HANDSHAKE: u8 = 0x16;
const ALERT: u8 = 0x15;

/// A TLS 1.2 ClientHello that any current server accepts or answers with
/// an alert: ECDHE with AES-GCM and ChaCha20, P-256 and X25519, ECDSA and
/// RSA signatures, and the server name when `host` is a name.
fn client_hello(host: &str) -> Vec<u8> {
    const SUITES: [u16; 6] = [0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8];
    const GROUPS: [u16; 3] = [0x001d, 0x0017, 0x0018];
    const SIGNATURES: [u16; 6] = [0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501];

    let mut extensions = Vec::new();
    if host.parse::<std::net::IpAddr>().is_err() && !host.is_empty() && host.len() < 256 {
        let name = host.as_bytes();
        let mut list = vec![0u8]; // host_name
        list.extend(u16_bytes(name.len()));
        list.extend(name);
        extension(&mut extensions, 0x0000, &with_u16_length(&list));
    }
    extension(&mut extensions, 0x000a, &with_u16_length(&u16s(&GROUPS)));
    extension(&mut extensions, 0x000b, &[1, 0]); // uncompressed points
    extension(
        &mut extensions,
        0x000d,
        &with_u16_length(&u16s(&SIGNATURES)),
    );
    extension(&mut extensions, 0x0017, &[]); // extended master secret
    extension(&mut extensions, 0xff01, &[0]); // renegotiation info

    let mut body = vec![3, 3]; // TLS 1.2
    body.extend((0u8..32).map(|i| i.wrapping_mul(37).wrapping_add(11))); // random
    body.push(0); // no session id
    body.extend(with_u16_length(&u16s(&SUITES)));
    body.extend([1, 0]); // null compression
    body.extend(with_u16_length(&extensions));

    let mut handshake = vec![1]; // client_hello
    handshake.extend(&u32_bytes(body.len())[1..]);
    handshake.extend(body);

    let mut record = vec![HANDSHAKE, 3, 1];
    record.extend(with_u16_length(&handshake));
    record
}

fn extension(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
    out.extend(kind.to_be_bytes());
    out.extend(with_u16_length(data));
}

fn with_u16_length(data: &[u8]) -> Vec<u8> {
    let mut out = u16_bytes(data.len()).to_vec();
    out.extend(data);
    out
}

fn u16s(values: &[u16]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_be_bytes())
        .collect()
}

fn u16_bytes(length: usize) -> [u8; 2] {
    u16::try_from(length).unwrap_or(u16::MAX).to_be_bytes()
}

fn u32_bytes(length: usize) -> [u8; 4] {
    u32::try_from(length).unwrap_or(u32::MAX).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A listener that answers whatever it reads with `reply`, once.
    fn answering(reply: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                let mut hello = [0u8; 5];
                let _ = stream.read_exact(&mut hello);
                let _ = stream.write_all(reply);
            }
        });
        address
    }

    #[test]
    fn the_hello_is_one_well_formed_record() {
        for host in ["broker.example.com", "127.0.0.1", "::1", ""] {
            let hello = client_hello(host);
            assert_eq!(&hello[..3], &[HANDSHAKE, 3, 1]);
            let record = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
            assert_eq!(record, hello.len() - 5, "record length for {host:?}");
            let body = u32::from_be_bytes([0, hello[6], hello[7], hello[8]]) as usize;
            assert_eq!(body, record - 4, "handshake length for {host:?}");
            let names = hello
                .windows(host.len().max(1))
                .any(|w| w == host.as_bytes());
            assert_eq!(
                names,
                host.contains(".com"),
                "server name only for a host name"
            );
        }
    }

    #[test]
    fn a_tls_alert_or_server_hello_is_tls() {
        assert!(speaks_tls(
            &answering(&[ALERT, 3, 3, 0, 2, 2, 40]),
            Duration::from_secs(2)
        ));
        assert!(speaks_tls(
            &answering(&[HANDSHAKE, 3, 3, 0, 80]),
            Duration::from_secs(2)
        ));
    }

    #[test]
    fn a_closed_connection_or_other_bytes_are_not() {
        assert!(!speaks_tls(&answering(b""), Duration::from_secs(2)));
        assert!(!speaks_tls(
            &answering(&[0, 0, 0, 12, 0, 18]),
            Duration::from_secs(2)
        ));
        assert!(!speaks_tls(
            &answering(b"HTTP/1.1 400"),
            Duration::from_secs(2)
        ));
    }

    #[test]
    fn nothing_listening_or_no_answer_within_the_timeout_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = listener.local_addr().unwrap().to_string();
        let started = std::time::Instant::now();
        assert!(!speaks_tls(&silent, Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(listener);
        assert!(!speaks_tls(&silent, Duration::from_millis(300)));
        assert!(!speaks_tls(
            "no-such-host.invalid:9093",
            Duration::from_millis(300)
        ));
    }

    #[test]
    fn bootstrap_lists_are_read_as_librdkafka_does() {
        let tls = answering(&[ALERT, 3, 3, 0, 2, 2, 40]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let closed = listener.local_addr().unwrap().to_string();
        drop(listener);
        let list = format!("{closed}, SSL://{tls}");
        assert_eq!(first_tls_listener(&list, Duration::from_secs(2)), Some(tls));
        assert_eq!(first_tls_listener(&closed, Duration::from_secs(2)), None);
    }
}
