//! A TCP forwarder on 127.0.0.1 that a test controls, to cut and stall the network
//! between a client and a server without root (no iptables, no tc, no namespaces).
//!
//! ```no_run
//! let proxy = testkit::Proxy::start("127.0.0.1:5432".parse()?)?;
//! let addr = proxy.addr(); // point the client here
//! proxy.cut_all();                                         // every connection drops
//! proxy.blackhole(std::time::Duration::from_secs(5));     // nothing moves for 5 s
//! proxy.set_refusing(true);                                // new connections are closed at once
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
//!
//! Plain std threads: one accept thread, two pump threads per connection. Bytes are
//! forwarded unchanged; while stalled the pumps stop reading, so TCP flow control
//! holds the data in the kernel buffers (nothing is lost or corrupted, as in a real
//! network stall), and new connections are accepted but not connected upstream until
//! the stall ends.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::err;
use crate::Result;

const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Default)]
struct Shared {
    upstream: Mutex<Option<SocketAddr>>,
    /// Until when (if set) nothing is forwarded.
    stalled_until: Mutex<Option<Instant>>,
    refusing: AtomicBool,
    stop: AtomicBool,
    /// Open connections: (id, client side, upstream side).
    conns: Mutex<Vec<(u64, TcpStream, Option<TcpStream>)>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    cuts: AtomicU64,
}

impl Shared {
    fn stalled(&self) -> bool {
        let mut g = self.stalled_until.lock().unwrap_or_else(|e| e.into_inner());
        match *g {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *g = None;
                false
            }
            None => false,
        }
    }

    fn wait_while_stalled(&self) {
        while self.stalled() && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(POLL);
        }
    }

    fn remove(&self, id: u64) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = conns.iter().position(|(cid, _, _)| *cid == id) {
            let (_, c, u) = conns.swap_remove(i);
            let _ = c.shutdown(Shutdown::Both);
            if let Some(u) = u {
                let _ = u.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A controllable TCP forwarder; see the module docs. Stops (and closes every
/// connection) on drop.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<Proxy> {
        let p = Proxy::bind()?;
        p.set_upstream(upstream);
        Ok(p)
    }

    /// Listens on a free 127.0.0.1 port without an upstream yet (connections are closed
    /// until [`Proxy::set_upstream`]): for servers that must know the proxy's address
    /// before they start, e.g. a Kafka broker advertising it.
    pub fn bind() -> Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| err(format!("proxy: cannot bind 127.0.0.1:0: {e}")))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let accept_thread = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || accept_loop(&listener, &s))?;
        Ok(Proxy { addr, shared, accept_thread: Some(accept_thread) })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Where connections go from now on (open connections keep theirs).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(upstream);
    }

    /// Closes every open connection at once (both directions; the peers see a reset or
    /// EOF). New connections are accepted as usual. Returns how many were closed.
    pub fn cut_all(&self) -> usize {
        let conns: Vec<_> = std::mem::take(&mut *self.shared.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, c, u) in &conns {
            let _ = c.shutdown(Shutdown::Both);
            if let Some(u) = u {
                let _ = u.shutdown(Shutdown::Both);
            }
        }
        self.shared.cuts.fetch_add(1, Ordering::Relaxed);
        conns.len()
    }

    /// Forwards nothing for `d` (returns at once): open connections stay open but no
    /// byte moves either way; new connections are accepted and held. Afterwards the held
    /// data flows again. Calling it again extends or shortens the stall.
    pub fn blackhole(&self, d: Duration) {
        *self.shared.stalled_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + d);
    }

    /// Ends a stall now.
    pub fn resume(&self) {
        *self.shared.stalled_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether a [`Proxy::blackhole`] is in force.
    pub fn is_stalled(&self) -> bool {
        self.shared.stalled()
    }

    /// While `true`, new connections are accepted and closed at once (like a server
    /// that is down); open connections are not touched (see [`Proxy::cut_all`]).
    pub fn set_refusing(&self, refusing: bool) {
        self.shared.refusing.store(refusing, Ordering::Relaxed);
    }

    /// Number of connections currently open through the proxy.
    pub fn open_connections(&self) -> usize {
        self.shared.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Number of connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.cut_all();
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                let upstream = *shared.upstream.lock().unwrap_or_else(|e| e.into_inner());
                if shared.refusing.load(Ordering::Relaxed) || upstream.is_none() {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let s = shared.clone();
                let _ = std::thread::Builder::new()
                    .name("proxy-conn".into())
                    .spawn(move || connection(client, upstream.unwrap_or_else(|| unreachable!()), &s));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn connection(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>) {
    let _ = client.set_nonblocking(false);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    // Registered before connecting, so a cut during a stall closes held clients too.
    let Ok(client_reg) = client.try_clone() else {
        return;
    };
    shared.conns.lock().unwrap_or_else(|e| e.into_inner()).push((id, client_reg, None));
    shared.wait_while_stalled();
    if shared.refusing.load(Ordering::Relaxed) || !registered(shared, id) {
        shared.remove(id);
        return;
    }
    let server = match TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(_) => {
            shared.remove(id);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let _ = client.set_nodelay(true);
    {
        let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        match conns.iter_mut().find(|(cid, _, _)| *cid == id) {
            Some(entry) => entry.2 = server.try_clone().ok(),
            None => {
                // Cut while connecting.
                let _ = server.shutdown(Shutdown::Both);
                let _ = client.shutdown(Shutdown::Both);
                return;
            }
        }
    }
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        shared.remove(id);
        return;
    };
    let s = shared.clone();
    let back = std::thread::Builder::new().name("proxy-pump".into()).spawn(move || pump(s2, c2, &s));
    pump(client, server, shared);
    if let Ok(t) = back {
        let _ = t.join();
    }
    shared.remove(id);
}

fn registered(shared: &Shared, id: u64) -> bool {
    shared.conns.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|(cid, _, _)| *cid == id)
}

/// Copies `from` -> `to` until EOF, an error, or a cut; stops reading while stalled.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let _ = from.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if shared.stalled() {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // A stall that starts now holds this chunk back too.
                shared.wait_while_stalled();
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if e.kind() == ErrorKind::WouldBlock
                    || e.kind() == ErrorKind::TimedOut
                    || e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    // Half-close towards the receiver, then make the other pump stop too.
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn roundtrip(c: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        c.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got)?;
        Ok(got)
    }

    #[test]
    fn forwards_cuts_stalls_and_refuses() {
        let proxy = Proxy::start(echo_server()).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(roundtrip(&mut c, b"hello").unwrap(), b"hello");

        // Stall: nothing comes back during it, everything after it.
        proxy.blackhole(Duration::from_millis(700));
        let t0 = Instant::now();
        assert_eq!(roundtrip(&mut c, b"held").unwrap(), b"held");
        assert!(t0.elapsed() >= Duration::from_millis(600), "{:?}", t0.elapsed());

        // Cut: the connection is closed.
        assert!(testkit_wait(|| proxy.open_connections() == 1));
        assert_eq!(proxy.cut_all(), 1);
        let mut buf = [0u8; 4];
        let r = c.write_all(b"x").and_then(|()| c.read(&mut buf));
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");

        // Refusing: new connections close at once; then normal again.
        proxy.set_refusing(true);
        let mut c2 = TcpStream::connect(proxy.addr()).unwrap();
        c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(roundtrip(&mut c2, b"no").is_err());
        proxy.set_refusing(false);
        let mut c3 = TcpStream::connect(proxy.addr()).unwrap();
        c3.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(roundtrip(&mut c3, b"again").unwrap(), b"again");
    }

    fn testkit_wait(mut f: impl FnMut() -> bool) -> bool {
        crate::wait_until(Duration::from_secs(5), &mut f)
    }
}
