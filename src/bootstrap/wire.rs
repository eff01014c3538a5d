//! The TCP store's wire format: frames, requests and responses. Pure encoding and decoding; it
//! must not touch sockets or clocks, and must never allocate from a length it has not checked.
//!
//! After the authentication handshake (context [`STORE_CONTEXT`]) both directions carry frames:
//! a `u32` little-endian payload length, at most [`MAX_FRAME`], then the payload. A client sends
//! one request and reads one response; requests on a connection are answered in order.
//!
//! ```text
//! request  = op (u8), then by op:
//!   1 SET    key length (u32), key, value (the rest)
//!   2 GET    timeout ms (u64), key (the rest)
//!   3 ADD    delta (i64), key (the rest)
//!   4 WAIT   timeout ms (u64), count (u32), count × (key length (u32), key)
//!   5 CHECK  count (u32), count × (key length (u32), key)
//! response = status (u8), then:
//!   0 OK       SET, WAIT: nothing; GET: the value; ADD: the new value (i64); CHECK: 1 or 0 (u8)
//!   1 TIMEOUT  the key still missing when the timeout passed
//!   2 ERROR    a message (an ADD to a value that is not a counter, say)
//! ```
//!
//! All integers are little-endian; keys are UTF-8.

use std::time::Duration;

/// Authentication context of store connections.
pub const STORE_CONTEXT: &[u8] = b"oxccl-store";

/// Largest frame payload in either direction: 16 MiB. A peer announcing more is dropped.
pub const MAX_FRAME: usize = 16 << 20;

const SET: u8 = 1;
const GET: u8 = 2;
const ADD: u8 = 3;
const WAIT: u8 = 4;
const CHECK: u8 = 5;

const OK: u8 = 0;
const TIMEOUT: u8 = 1;
const ERROR: u8 = 2;

/// A decoded request.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Request {
    Set {
        key: String,
        value: Vec<u8>,
    },
    Get {
        key: String,
        timeout: Duration,
    },
    Add {
        key: String,
        delta: i64,
    },
    Wait {
        keys: Vec<String>,
        timeout: Duration,
    },
    Check {
        keys: Vec<String>,
    },
}

/// A decoded response.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Response {
    Ok(Vec<u8>),
    Timeout(String),
    Error(String),
}

/// A frame under construction: the length prefix is filled in by [`Frame::finish`].
struct Frame(Vec<u8>);

impl Frame {
    fn new(op: u8, size_hint: usize) -> Frame {
        let mut v = Vec::with_capacity(5 + size_hint);
        v.extend_from_slice(&[0, 0, 0, 0, op]);
        Frame(v)
    }

    fn bytes(mut self, b: &[u8]) -> Frame {
        self.0.extend_from_slice(b);
        self
    }

    fn key_list(mut self, keys: &[&str]) -> Frame {
        self.0.extend_from_slice(&(keys.len() as u32).to_le_bytes());
        for k in keys {
            self.0.extend_from_slice(&(k.len() as u32).to_le_bytes());
            self.0.extend_from_slice(k.as_bytes());
        }
        self
    }

    /// The frame, or its payload length when that exceeds [`MAX_FRAME`].
    fn finish(mut self) -> Result<Vec<u8>, usize> {
        let len = self.0.len() - 4;
        if len > MAX_FRAME {
            return Err(len);
        }
        self.0[..4].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(self.0)
    }
}

fn millis(timeout: Duration) -> [u8; 8] {
    // Round up, so a wait of 0.4 ms is not sent as "do not wait".
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).to_le_bytes()
}

/// Encodes a SET frame; `Err` carries the payload length when it exceeds [`MAX_FRAME`].
pub(super) fn set(key: &str, value: &[u8]) -> Result<Vec<u8>, usize> {
    Frame::new(SET, 4 + key.len() + value.len())
        .bytes(&(key.len() as u32).to_le_bytes())
        .bytes(key.as_bytes())
        .bytes(value)
        .finish()
}

/// Encodes a GET frame.
pub(super) fn get(key: &str, timeout: Duration) -> Result<Vec<u8>, usize> {
    Frame::new(GET, 8 + key.len())
        .bytes(&millis(timeout))
        .bytes(key.as_bytes())
        .finish()
}

/// Encodes an ADD frame.
pub(super) fn add(key: &str, delta: i64) -> Result<Vec<u8>, usize> {
    Frame::new(ADD, 8 + key.len())
        .bytes(&delta.to_le_bytes())
        .bytes(key.as_bytes())
        .finish()
}

/// Encodes a WAIT frame.
pub(super) fn wait(keys: &[&str], timeout: Duration) -> Result<Vec<u8>, usize> {
    Frame::new(WAIT, 12)
        .bytes(&millis(timeout))
        .key_list(keys)
        .finish()
}

/// Encodes a CHECK frame.
pub(super) fn check(keys: &[&str]) -> Result<Vec<u8>, usize> {
    Frame::new(CHECK, 4).key_list(keys).finish()
}

/// Encodes a response frame (bodies never exceed a request's size, so no check is needed beyond
/// the one the request passed).
pub(super) fn response(r: &Response) -> Vec<u8> {
    let (status, body): (u8, &[u8]) = match r {
        Response::Ok(v) => (OK, v),
        Response::Timeout(k) => (TIMEOUT, k.as_bytes()),
        Response::Error(m) => (ERROR, m.as_bytes()),
    };
    let mut v = Vec::with_capacity(5 + body.len());
    v.extend_from_slice(&((1 + body.len()) as u32).to_le_bytes());
    v.push(status);
    v.extend_from_slice(body);
    v
}

/// A bounds-checked reader over a payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated {what}: need {n} bytes, have {}",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<usize, String> {
        Ok(u32::from_le_bytes(self.array(what)?) as usize)
    }

    fn timeout(&mut self) -> Result<Duration, String> {
        Ok(Duration::from_millis(u64::from_le_bytes(
            self.array("timeout")?,
        )))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    fn key(bytes: &[u8]) -> Result<String, String> {
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| "key is not UTF-8".to_owned())
    }

    fn key_list(&mut self) -> Result<Vec<String>, String> {
        let count = self.u32("key count")?;
        // Every key costs at least its 4-byte length, so `count` is checked against what is
        // left before anything is allocated for it.
        if count > self.0.len() / 4 {
            return Err(format!("{count} keys announced in {} bytes", self.0.len()));
        }
        let mut keys = Vec::with_capacity(count);
        for _ in 0..count {
            let len = self.u32("key length")?;
            keys.push(Self::key(self.take(len, "key")?)?);
        }
        Ok(keys)
    }
}

impl Request {
    /// Decodes one request payload (the frame without its length prefix).
    pub(super) fn decode(payload: &[u8]) -> Result<Request, String> {
        let mut r = Reader(payload);
        let req = match r.u8("op")? {
            SET => {
                let len = r.u32("key length")?;
                let key = Reader::key(r.take(len, "key")?)?;
                Request::Set {
                    key,
                    value: r.rest().to_vec(),
                }
            }
            GET => {
                let timeout = r.timeout()?;
                Request::Get {
                    key: Reader::key(r.rest())?,
                    timeout,
                }
            }
            ADD => {
                let delta = i64::from_le_bytes(r.array("delta")?);
                Request::Add {
                    key: Reader::key(r.rest())?,
                    delta,
                }
            }
            WAIT => {
                let timeout = r.timeout()?;
                Request::Wait {
                    keys: r.key_list()?,
                    timeout,
                }
            }
            CHECK => Request::Check {
                keys: r.key_list()?,
            },
            op => return Err(format!("unknown op {op}")),
        };
        if !r.0.is_empty() {
            return Err(format!("{} trailing bytes", r.0.len()));
        }
        Ok(req)
    }
}

impl Response {
    /// Decodes one response payload.
    pub(super) fn decode(payload: &[u8]) -> Result<Response, String> {
        let mut r = Reader(payload);
        let status = r.u8("status")?;
        let body = r.rest();
        let text = || String::from_utf8_lossy(body).into_owned();
        match status {
            OK => Ok(Response::Ok(body.to_vec())),
            TIMEOUT => Ok(Response::Timeout(text())),
            ERROR => Ok(Response::Error(text())),
            s => Err(format!("unknown status {s}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzzed_store_frames_never_panic_nor_overallocate() {
        let ms = Duration::from_millis(5);
        let requests: Vec<Vec<u8>> = [
            set("key", b"value").unwrap(),
            get("a/b/c", ms).unwrap(),
            add("counter", -7).unwrap(),
            wait(&["x", "y", "z"], ms).unwrap(),
            check(&["only"]).unwrap(),
        ]
        .into_iter()
        .map(payload)
        .collect();
        crate::fuzz::run("store Request::decode", &requests, |b| {
            let _ = std::hint::black_box(Request::decode(b));
        });
        let responses: Vec<Vec<u8>> = [
            Response::Ok(b"v".to_vec()),
            Response::Timeout("t".into()),
            Response::Error("e".into()),
        ]
        .iter()
        .map(|r| payload(response(r)))
        .collect();
        crate::fuzz::run("store Response::decode", &responses, |b| {
            let _ = std::hint::black_box(Response::decode(b));
        });
    }

    fn payload(frame: Vec<u8>) -> Vec<u8> {
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(len, frame.len() - 4);
        frame[4..].to_vec()
    }

    #[test]
    fn requests_round_trip() {
        let t = Duration::from_millis(1500);
        let cases = [
            (
                set("a", b"xyz").unwrap(),
                Request::Set {
                    key: "a".into(),
                    value: b"xyz".to_vec(),
                },
            ),
            (
                get("k", t).unwrap(),
                Request::Get {
                    key: "k".into(),
                    timeout: t,
                },
            ),
            (
                add("c", -7).unwrap(),
                Request::Add {
                    key: "c".into(),
                    delta: -7,
                },
            ),
            (
                wait(&["x", "yy"], t).unwrap(),
                Request::Wait {
                    keys: vec!["x".into(), "yy".into()],
                    timeout: t,
                },
            ),
            (check(&[]).unwrap(), Request::Check { keys: vec![] }),
        ];
        for (frame, want) in cases {
            assert_eq!(Request::decode(&payload(frame)).unwrap(), want);
        }
        assert_eq!(
            Request::decode(&payload(get("k", Duration::from_nanos(1)).unwrap())).unwrap(),
            Request::Get {
                key: "k".into(),
                timeout: Duration::from_millis(1)
            }
        );
    }

    #[test]
    fn responses_round_trip() {
        for r in [
            Response::Ok(b"v".to_vec()),
            Response::Timeout("k".into()),
            Response::Error("no".into()),
        ] {
            assert_eq!(Response::decode(&payload(response(&r))).unwrap(), r);
        }
    }

    #[test]
    fn garbage_is_rejected_without_allocating_from_lengths() {
        assert!(Request::decode(&[]).is_err());
        assert!(Request::decode(&[9]).is_err());
        assert!(Request::decode(&[SET, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(Request::decode(&[CHECK, 0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(Request::decode(&[CHECK, 0, 0, 0, 0, 1]).is_err());
        assert!(Request::decode(&[GET, 0, 0, 0, 0, 0, 0, 0, 0, 0xff]).is_err());
        assert!(Response::decode(&[7]).is_err());
        assert_eq!(set("k", &vec![0; MAX_FRAME]), Err(MAX_FRAME + 6));
    }
}
