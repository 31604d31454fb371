//! The out-of-band exchange of rdma-core's `ibv_{rc,uc,ud}_pingpong`: over TCP (default port
//! 18515) each side sends `"LLLL:QQQQQQ:PPPPPP:GGGG…"` — LID, QPN, PSN and the GID as 32 hex
//! digits — NUL-terminated in a 52-byte message; the client then sends `"done\0"`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use rxe_core::Gid;

pub const MSG_LEN: usize = 52;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
}

impl Dest {
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut s = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}"));
        }
        let mut m = [0u8; MSG_LEN];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }

    pub fn decode(m: &[u8]) -> io::Result<Dest> {
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "malformed pingpong address message",
            )
        };
        let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
        let s = std::str::from_utf8(&m[..end]).map_err(|_| bad())?;
        let mut it = s.split(':');
        let mut hex = |max_len: usize| -> io::Result<&str> {
            let f = it.next().ok_or_else(bad)?;
            if f.is_empty() || f.len() > max_len || !f.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            Ok(f)
        };
        let lid = u16::from_str_radix(hex(4)?, 16).map_err(|_| bad())?;
        let qpn = u32::from_str_radix(hex(6)?, 16).map_err(|_| bad())?;
        let psn = u32::from_str_radix(hex(6)?, 16).map_err(|_| bad())?;
        let g = hex(32)?;
        if g.len() != 32 {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }
}

fn read_exact_timeout(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.read_exact(buf)
}

/// Client side: connect, send ours, read theirs, send "done".
pub fn client_exchange(server: SocketAddr, mine: &Dest, timeout: Duration) -> io::Result<Dest> {
    let deadline = std::time::Instant::now() + timeout;
    // The server may not be listening yet: retry for a bounded time.
    let mut s = loop {
        match TcpStream::connect_timeout(&server, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    };
    s.write_all(&mine.encode())?;
    let mut m = [0u8; MSG_LEN];
    read_exact_timeout(&mut s, &mut m)?;
    s.write_all(b"done\0")?;
    Dest::decode(&m)
}

/// Server side: accept one client, read theirs, run `connect` (bring our QP to RTS, as the
/// tool does before answering), send ours, read "done".
pub fn server_exchange(
    listen: SocketAddr,
    mine: impl FnOnce(&Dest) -> io::Result<Dest>,
) -> io::Result<Dest> {
    let l = TcpListener::bind(listen)?;
    let (mut s, _) = l.accept()?;
    let mut m = [0u8; MSG_LEN];
    read_exact_timeout(&mut s, &mut m)?;
    let theirs = Dest::decode(&m)?;
    let ours = mine(&theirs)?;
    s.write_all(&ours.encode())?;
    let mut done = [0u8; 5];
    let _ = read_exact_timeout(&mut s, &mut done);
    Ok(theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_format_matches_the_tools() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from_ipv4([10, 77, 0, 2]),
        };
        let m = d.encode();
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0a4d0002"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
        assert!(Dest::decode(b"zz").is_err());
        assert!(Dest::decode(b"0000:000011:abcdef:0000").is_err());
    }
}
