//! A minimal Kafka `Metadata` client (API key 3, version 8) over a plain TCP socket:
//! enough to see which brokers are live, who leads a partition and which replicas are in
//! sync, without starting a JVM (a Kafka CLI tool costs ~1-1.5 s per call).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::util::err;
use crate::Result;

const API_METADATA: i16 = 3;
/// Version 8: the last non-flexible version (no tagged fields, no compact strings);
/// Apache Kafka 4.x serves Metadata v0..v13.
const METADATA_VERSION: i16 = 8;
const CLIENT_ID: &str = "walpost-testkit";

/// A cluster's metadata as one broker sees it (a `Metadata` v8 response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The cluster id (KRaft: the id given to `kafka-storage format`).
    pub cluster_id: Option<String>,
    /// Live brokers (KRaft: registered and not fenced), sorted by id.
    pub brokers: Vec<BrokerMetadata>,
    /// Topics (all of them, internal ones included, when no names were asked for),
    /// sorted by name.
    pub topics: Vec<TopicMetadata>,
}

/// One live broker of a [`Metadata`] response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerMetadata {
    /// `node.id`.
    pub id: i32,
    /// Advertised host.
    pub host: String,
    /// Advertised port.
    pub port: i32,
}

/// One topic of a [`Metadata`] response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// Topic name.
    pub name: String,
    /// Kafka error code for the topic (0 = none; 3 = unknown topic).
    pub error_code: i16,
    /// Internal topic (`__consumer_offsets`, `__transaction_state`, ...).
    pub internal: bool,
    /// Partitions, sorted by index.
    pub partitions: Vec<PartitionMetadata>,
}

/// One partition of a [`TopicMetadata`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// Partition index.
    pub partition: i32,
    /// Kafka error code (0 = none; 5 = leader not available, 9 = replica not available).
    pub error_code: i16,
    /// Leader's node id, `None` if there is none (e.g. every replica is down).
    pub leader: Option<i32>,
    /// Leader epoch (grows with every leader change).
    pub leader_epoch: i32,
    /// Assigned replicas (the first is the preferred leader).
    pub replicas: Vec<i32>,
    /// In-sync replicas.
    pub isr: Vec<i32>,
    /// Replicas on offline log directories.
    pub offline: Vec<i32>,
}

impl Metadata {
    /// Ids of the live brokers.
    pub fn broker_ids(&self) -> Vec<i32> {
        self.brokers.iter().map(|b| b.id).collect()
    }

    /// The topic named `name`, if present and without error.
    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics.iter().find(|t| t.name == name && t.error_code == 0)
    }

    /// `(topic, partition)` of every partition whose ISR is smaller than its replica set.
    pub fn under_replicated(&self) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for t in &self.topics {
            for p in &t.partitions {
                if p.leader.is_none() || !p.replicas.iter().all(|r| p.isr.contains(r)) {
                    out.push((t.name.clone(), p.partition));
                }
            }
        }
        out
    }
}

/// Sends one Metadata request to `addr` (`host:port`) and parses the answer. `topics`:
/// `None` = all topics; topics are never auto-created by this request.
pub fn fetch_metadata(addr: &str, topics: Option<&[&str]>, timeout: Duration) -> Result<Metadata> {
    let sock: SocketAddr =
        addr.to_socket_addrs()?.next().ok_or_else(|| err(format!("metadata: cannot resolve {addr}")))?;
    let mut stream = TcpStream::connect_timeout(&sock, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;

    let correlation_id = 1;
    let mut body = Vec::new();
    body.extend_from_slice(&API_METADATA.to_be_bytes());
    body.extend_from_slice(&METADATA_VERSION.to_be_bytes());
    body.extend_from_slice(&i32::to_be_bytes(correlation_id));
    put_string(&mut body, CLIENT_ID);
    match topics {
        None => body.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(names) => {
            body.extend_from_slice(&i32::try_from(names.len()).unwrap_or(i32::MAX).to_be_bytes());
            for n in names {
                put_string(&mut body, n);
            }
        }
    }
    body.push(0); // allow_auto_topic_creation
    body.push(0); // include_cluster_authorized_operations
    body.push(0); // include_topic_authorized_operations
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&body);
    stream.write_all(&frame)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > 64 << 20 {
        return Err(err(format!("metadata: implausible response size {len} from {addr}")));
    }
    let mut resp = vec![0u8; len];
    stream.read_exact(&mut resp)?;
    let mut r = Reader { buf: &resp, pos: 0 };
    let got = r.i32()?;
    if got != correlation_id {
        return Err(err(format!("metadata: correlation id {got}, expected {correlation_id}")));
    }
    parse_v8(&mut r).map_err(|e| err(format!("metadata from {addr}: {e}")))
}

fn parse_v8(r: &mut Reader<'_>) -> Result<Metadata> {
    let _throttle_ms = r.i32()?;
    let mut brokers = r.array(|r| {
        let id = r.i32()?;
        let host = r.string()?;
        let port = r.i32()?;
        let _rack = r.nullable_string()?;
        Ok(BrokerMetadata { id, host, port })
    })?;
    brokers.sort_by_key(|b| b.id);
    let cluster_id = r.nullable_string()?;
    let _controller_id = r.i32()?; // KRaft: a random live broker, not the controller
    let mut topics = r.array(|r| {
        let error_code = r.i16()?;
        let name = r.string()?;
        let internal = r.i8()? != 0;
        let mut partitions = r.array(|r| {
            let error_code = r.i16()?;
            let partition = r.i32()?;
            let leader = r.i32()?;
            let leader_epoch = r.i32()?;
            let replicas = r.array(Reader::i32)?;
            let isr = r.array(Reader::i32)?;
            let offline = r.array(Reader::i32)?;
            Ok(PartitionMetadata {
                partition,
                error_code,
                leader: (leader >= 0).then_some(leader),
                leader_epoch,
                replicas,
                isr,
                offline,
            })
        })?;
        partitions.sort_by_key(|p| p.partition);
        let _topic_authorized_operations = r.i32()?;
        Ok(TopicMetadata { name, error_code, internal, partitions })
    })?;
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let _cluster_authorized_operations = r.i32()?;
    Ok(Metadata { cluster_id, brokers, topics })
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&i16::try_from(s.len()).unwrap_or(i16::MAX).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| err("response too short"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn i8(&mut self) -> Result<i8> {
        Ok(i8::from_be_bytes([self.take(1)?[0]]))
    }
    fn i16(&mut self) -> Result<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn nullable_string(&mut self) -> Result<Option<String>> {
        let n = self.i16()?;
        if n < 0 {
            return Ok(None);
        }
        let b = self.take(n as usize)?;
        Ok(Some(String::from_utf8_lossy(b).into_owned()))
    }
    fn string(&mut self) -> Result<String> {
        self.nullable_string()?.ok_or_else(|| err("null string"))
    }
    fn array<T>(&mut self, mut item: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(Vec::new());
        }
        if n as usize > self.buf.len() {
            return Err(err(format!("array length {n} exceeds the response")));
        }
        (0..n).map(|_| item(self)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(buf: &mut Vec<u8>, v: &str) {
        put_string(buf, v);
    }

    #[test]
    fn parses_a_v8_response() {
        let mut b = Vec::new();
        b.extend_from_slice(&0i32.to_be_bytes()); // throttle
        b.extend_from_slice(&2i32.to_be_bytes()); // 2 brokers
        for id in [2i32, 1] {
            b.extend_from_slice(&id.to_be_bytes());
            s(&mut b, "127.0.0.1");
            b.extend_from_slice(&(9000 + id).to_be_bytes());
            b.extend_from_slice(&(-1i16).to_be_bytes()); // rack null
        }
        s(&mut b, "cid");
        b.extend_from_slice(&1i32.to_be_bytes()); // controller
        b.extend_from_slice(&1i32.to_be_bytes()); // 1 topic
        b.extend_from_slice(&0i16.to_be_bytes());
        s(&mut b, "t");
        b.push(0);
        b.extend_from_slice(&1i32.to_be_bytes()); // 1 partition
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes()); // index
        b.extend_from_slice(&(-1i32).to_be_bytes()); // no leader
        b.extend_from_slice(&7i32.to_be_bytes()); // epoch
        for arr in [&[1i32, 2][..], &[2][..], &[][..]] {
            b.extend_from_slice(&(arr.len() as i32).to_be_bytes());
            for x in arr {
                b.extend_from_slice(&x.to_be_bytes());
            }
        }
        b.extend_from_slice(&0i32.to_be_bytes()); // topic ops
        b.extend_from_slice(&0i32.to_be_bytes()); // cluster ops
        let m = parse_v8(&mut Reader { buf: &b, pos: 0 }).expect("parse");
        assert_eq!(m.broker_ids(), vec![1, 2]);
        assert_eq!(m.cluster_id.as_deref(), Some("cid"));
        let p = &m.topic("t").expect("topic").partitions[0];
        assert_eq!((p.leader, p.leader_epoch, p.isr.clone()), (None, 7, vec![2]));
        assert_eq!(m.under_replicated(), vec![("t".to_string(), 0)]);
        // Truncated input is an error, not a panic.
        assert!(parse_v8(&mut Reader { buf: &b[..b.len() - 3], pos: 0 }).is_err());
    }
}
