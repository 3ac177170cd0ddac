//! A lean HTTP/1.1 client: one blocking keep-alive connection that sends a prepared request
//! and reads the answer straight from the socket.

use super::QUERY_TIMEOUT;
use std::io::Write as _;

/// One blocking HTTP/1.1 keep-alive connection.
pub(super) struct LeanConn {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl LeanConn {
    pub(super) fn open(addr: &str) -> Result<Self, String> {
        let stream =
            std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(QUERY_TIMEOUT));
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 << 10),
        })
    }

    /// Sends `request`, returns the body of a 200 answer (content-length or chunked).
    pub(super) fn ask(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        use std::io::Read;
        let io = |e: std::io::Error| format!("HTTP connection: {e}");
        self.stream.write_all(request).map_err(io)?;
        self.buf.clear();
        let (status, head, length, chunked) = loop {
            self.fill().map_err(io)?;
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut r = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head) = r
                .parse(&self.buf)
                .map_err(|e| format!("bad HTTP answer: {e}"))?
            {
                let header = |name: &str| {
                    (r.headers.iter())
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| h.value)
                };
                let length = header("content-length")
                    .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
                let chunked =
                    header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked"));
                break (r.code.unwrap_or(0), head, length, chunked);
            }
        };
        let body = match (length, chunked) {
            (Some(n), _) => {
                while self.buf.len() < head + n {
                    self.fill().map_err(io)?;
                }
                self.buf[head..head + n].to_vec()
            }
            (None, true) => {
                let mut body = Vec::new();
                let mut at = head;
                loop {
                    let Some(eol) = find_crlf(&self.buf[at..]) else {
                        self.fill().map_err(io)?;
                        continue;
                    };
                    let size = std::str::from_utf8(&self.buf[at..at + eol])
                        .ok()
                        .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
                        .ok_or("bad chunk size")?;
                    let need = at + eol + 2 + size + 2;
                    while self.buf.len() < need {
                        self.fill().map_err(io)?;
                    }
                    body.extend_from_slice(&self.buf[at + eol + 2..at + eol + 2 + size]);
                    at = need;
                    if size == 0 {
                        break;
                    }
                }
                body
            }
            // No body: informational, 204 and 304 answers.
            (None, false) if status < 200 || status == 204 || status == 304 => Vec::new(),
            (None, false) => {
                let mut rest = Vec::new();
                self.stream.read_to_end(&mut rest).map_err(io)?;
                self.buf.extend_from_slice(&rest);
                self.buf[head..].to_vec()
            }
        };
        if status != 200 {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body)
    }

    fn fill(&mut self) -> std::io::Result<()> {
        use std::io::Read;
        let mut piece = [0u8; 16 << 10];
        let n = self.stream.read(&mut piece)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&piece[..n]);
        Ok(())
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// A server that answers each request on one connection with the next of `answers`,
    /// written a few bytes at a time, so the client must put them together.
    fn serve(answers: Vec<&'static [u8]>) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4096];
            for a in answers {
                let _ = s.read(&mut buf).unwrap();
                for piece in a.chunks(7) {
                    s.write_all(piece).unwrap();
                    s.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        addr
    }

    #[test]
    fn the_lean_client_reads_sized_chunked_and_error_answers() {
        let addr = serve(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n[{\"n\":209}]",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n[{\"n\"\r\n6;x=1\r\n:209}]\r\n0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 9\r\n\r\nno table.",
        ]);
        let mut c = LeanConn::open(&addr).unwrap();
        let req = b"POST /v1/sql HTTP/1.1\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(c.ask(req).unwrap(), b"[{\"n\":209}]");
        assert_eq!(c.ask(req).unwrap(), b"[{\"n\":209}]");
        assert_eq!(c.ask(req).unwrap_err(), "HTTP 400: no table.");
        // The server hung up: a clear error, not a hang or a panic.
        assert!(c.ask(req).unwrap_err().contains("HTTP connection"));
    }
}
