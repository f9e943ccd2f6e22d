//! The protocol state of a link as plain data: which requests a poll
//! group makes (coalesced ranges), when each is due ([`Poller`]), and what
//! a failed request means ([`FaultKind`]). No I/O here; the link task in
//! [`super`] runs it.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::codec::{Codec, Table};

/// One sensor as its link polls it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SensorRead {
    pub name: String,
    /// The device's unit id.
    pub unit: u8,
    pub table: Table,
    pub address: u16,
    pub codec: Codec,
    /// Its poll group's period.
    pub every: Duration,
}

/// Where a sensor's value lies in a request's reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Slot {
    pub sensor: String,
    /// From the request's first address.
    pub offset: u16,
    pub codec: Codec,
}

/// One read request: `count` items of `table` from `start`, feeding `slots`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReadRequest {
    pub unit: u8,
    pub table: Table,
    pub start: u16,
    pub count: u16,
    pub slots: Vec<Slot>,
}

impl ReadRequest {
    /// The sensors' values from a register reply (`None` for a sensor the
    /// reply is too short for).
    pub(crate) fn values_in_words<'a>(
        &'a self,
        words: &'a [u16],
    ) -> impl Iterator<Item = (&'a str, Option<f64>)> + 'a {
        self.slots.iter().map(move |s| {
            let value = words
                .get(usize::from(s.offset)..)
                .and_then(|w| s.codec.decode_words(w));
            (s.sensor.as_str(), value)
        })
    }

    /// The sensors' values from a bit reply.
    pub(crate) fn values_in_bits<'a>(
        &'a self,
        bits: &'a [bool],
    ) -> impl Iterator<Item = (&'a str, Option<f64>)> + 'a {
        self.slots.iter().map(move |s| {
            let value = bits
                .get(usize::from(s.offset))
                .map(|b| s.codec.decode_bit(*b));
            (s.sensor.as_str(), value)
        })
    }

    /// `holding 100-131`: what the log and errors name.
    pub(crate) fn describe(&self) -> String {
        let last = u32::from(self.start) + u32::from(self.count.max(1)) - 1;
        format!(
            "unit {} {} {}-{last}",
            self.unit,
            self.table.as_str(),
            self.start
        )
    }
}

/// The requests read together at one rate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PollGroup {
    pub every: Duration,
    pub requests: Vec<ReadRequest>,
}

/// Coalesces the sensors of one link into poll groups (one per rate), each
/// reading its sensors in as few requests as their addresses allow: a
/// request spans addresses of one table whose gaps are at most `max_gap`
/// items, and at most `max_registers` registers (the protocol's 2000 for
/// bits). Sensors at the same address share it.
pub(crate) fn plan(sensors: &[SensorRead], max_registers: u16, max_gap: u16) -> Vec<PollGroup> {
    let mut rates: Vec<Duration> = sensors.iter().map(|s| s.every).collect();
    rates.sort();
    rates.dedup();
    rates
        .into_iter()
        .map(|every| {
            let mut mine: Vec<&SensorRead> = sensors.iter().filter(|s| s.every == every).collect();
            mine.sort_by_key(|s| (s.unit, s.table, s.address));
            let mut requests: Vec<ReadRequest> = Vec::new();
            for s in mine {
                let width = s.codec.value_type.width();
                let end = u32::from(s.address) + u32::from(width);
                let limit = if s.table.is_bits() {
                    s.table.max_read()
                } else {
                    max_registers.clamp(1, s.table.max_read())
                };
                let joins = requests.last().is_some_and(|r| {
                    let r_end = u32::from(r.start) + u32::from(r.count);
                    r.unit == s.unit
                        && r.table == s.table
                        && u32::from(s.address) <= r_end + u32::from(max_gap)
                        && end.max(r_end) - u32::from(r.start) <= u32::from(limit)
                });
                if joins && let Some(r) = requests.last_mut() {
                    let r_end = u32::from(r.start) + u32::from(r.count);
                    r.count = u16::try_from(end.max(r_end) - u32::from(r.start)).unwrap_or(limit);
                    r.slots.push(Slot {
                        sensor: s.name.clone(),
                        offset: s.address - r.start,
                        codec: s.codec,
                    });
                } else {
                    requests.push(ReadRequest {
                        unit: s.unit,
                        table: s.table,
                        start: s.address,
                        count: width,
                        slots: vec![Slot {
                            sensor: s.name.clone(),
                            offset: 0,
                            codec: s.codec,
                        }],
                    });
                }
            }
            PollGroup { every, requests }
        })
        .collect()
}

/// When each poll group's requests are due. A group whose requests of the
/// last period are still waiting when the next is due misses that poll
/// (counted), rather than piling up requests the link cannot serve.
#[derive(Debug)]
pub(crate) struct Poller {
    groups: Vec<GroupState>,
    /// (group, request) due now, in order.
    queue: VecDeque<(usize, usize)>,
    missed: u64,
}

#[derive(Debug)]
struct GroupState {
    every: Duration,
    requests: usize,
    next_due: Instant,
    /// Its requests still in the queue.
    waiting: usize,
}

impl Poller {
    /// Every group due at `now`.
    pub(crate) fn new(groups: &[PollGroup], now: Instant) -> Poller {
        Poller {
            groups: groups
                .iter()
                .map(|g| GroupState {
                    every: g.every,
                    requests: g.requests.len(),
                    next_due: now,
                    waiting: 0,
                })
                .collect(),
            queue: VecDeque::new(),
            missed: 0,
        }
    }

    /// Starts over at `now` (after a reconnection): nothing waits.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.queue.clear();
        for g in &mut self.groups {
            g.next_due = now;
            g.waiting = 0;
        }
    }

    /// When the next request is due (`now` when one waits): `None`
    /// without groups.
    pub(crate) fn next_wake(&self, now: Instant) -> Option<Instant> {
        if !self.queue.is_empty() {
            return Some(now);
        }
        self.groups.iter().map(|g| g.next_due).min()
    }

    /// The next request due at `now` (group, request index), if any.
    pub(crate) fn take(&mut self, now: Instant) -> Option<(usize, usize)> {
        for (i, g) in self.groups.iter_mut().enumerate() {
            if g.next_due > now {
                continue;
            }
            if g.waiting > 0 {
                self.missed += 1;
            } else {
                self.queue.extend((0..g.requests).map(|r| (i, r)));
                g.waiting = g.requests;
            }
            g.next_due += g.every;
            if g.next_due <= now {
                // More than one period behind: those polls are missed too.
                let behind = now.saturating_duration_since(g.next_due);
                let periods = behind.as_nanos() / g.every.as_nanos().max(1) + 1;
                self.missed += u64::try_from(periods).unwrap_or(u64::MAX);
                g.next_due += g
                    .every
                    .saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX));
            }
        }
        let (g, r) = self.queue.pop_front()?;
        self.groups[g].waiting = self.groups[g].waiting.saturating_sub(1);
        Some((g, r))
    }

    /// Polls missed so far.
    pub(crate) fn missed(&self) -> u64 {
        self.missed
    }
}

/// The latest request latencies of a link (µs), a fixed ring: what its
/// percentiles in `/v1/observation` are taken over.
#[derive(Debug, Clone)]
pub(crate) struct LatencyRing {
    values: Vec<u64>,
    next: usize,
}

impl Default for LatencyRing {
    fn default() -> Self {
        LatencyRing {
            values: Vec::with_capacity(Self::CAPACITY),
            next: 0,
        }
    }
}

impl LatencyRing {
    pub(crate) const CAPACITY: usize = 1024;

    pub(crate) fn push(&mut self, us: u64) {
        if self.values.len() < Self::CAPACITY {
            self.values.push(us);
        } else {
            self.values[self.next] = us;
        }
        self.next = (self.next + 1) % Self::CAPACITY;
    }

    /// Nearest-rank percentile (`p` in 0..=1); 0 when empty.
    pub(crate) fn percentile(&self, p: f64) -> u64 {
        if self.values.is_empty() {
            return 0;
        }
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        let rank = (p * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }
}

/// What one actuator command writes.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// FC 6.
    Register(u16),
    /// FC 16.
    Registers(Vec<u16>),
    /// FC 5.
    Coil(bool),
    /// FC 15.
    Coils(Vec<bool>),
}

impl WriteOp {
    /// The write of `value` (engineering units) to `point` by `mode`.
    pub fn new(
        point: &crate::hw::config::ModbusPoint,
        mode: crate::hw::config::WriteMode,
        value: f64,
    ) -> Result<WriteOp, super::codec::EncodeError> {
        use crate::hw::config::WriteMode;
        if point.table.is_bits() {
            let bit = point.codec.encode_bit(value)?;
            return Ok(match mode {
                WriteMode::Single => WriteOp::Coil(bit),
                WriteMode::Multiple => WriteOp::Coils(vec![bit]),
            });
        }
        let words = point.codec.encode_words(value)?;
        Ok(match (mode, words.as_slice()) {
            (WriteMode::Single, [word]) => WriteOp::Register(*word),
            _ => WriteOp::Registers(words),
        })
    }

    /// Whether registers read back hold what was written.
    pub fn matches_words(&self, words: &[u16]) -> bool {
        match self {
            WriteOp::Register(w) => words.first() == Some(w),
            WriteOp::Registers(ws) => words.get(..ws.len()) == Some(ws.as_slice()),
            WriteOp::Coil(_) | WriteOp::Coils(_) => false,
        }
    }

    /// Whether a coil read back holds what was written.
    pub fn matches_bits(&self, bits: &[bool]) -> bool {
        match self {
            WriteOp::Coil(b) => bits.first() == Some(b),
            WriteOp::Coils(bs) => bits.get(..bs.len()) == Some(bs.as_slice()),
            WriteOp::Register(_) | WriteOp::Registers(_) => false,
        }
    }
}

/// What kind of failure a request met (the counters' labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum FaultKind {
    /// The device answered with a Modbus exception.
    Exception,
    /// No reply within the request timeout.
    Timeout,
    /// Bytes came back but no valid frame (a CRC error on RTU).
    BadFrame,
    /// The connection or port failed.
    Disconnected,
    /// A reply that does not answer the request.
    Protocol,
}

impl FaultKind {
    pub(crate) const ALL: [FaultKind; 5] = [
        FaultKind::Exception,
        FaultKind::Timeout,
        FaultKind::BadFrame,
        FaultKind::Disconnected,
        FaultKind::Protocol,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FaultKind::Exception => "exception",
            FaultKind::Timeout => "timeout",
            FaultKind::BadFrame => "bad_frame",
            FaultKind::Disconnected => "disconnected",
            FaultKind::Protocol => "protocol",
        }
    }

    /// Worth sending the request again (the device may not have seen it).
    pub(crate) fn retryable(self) -> bool {
        matches!(self, FaultKind::Timeout | FaultKind::BadFrame)
    }

    /// Whether the connection must be made again. On TCP a reply that did
    /// not come in time may still come and be taken for the next one's, so
    /// a timeout ends the connection; an RTU line clears its buffer before
    /// every request, so only a failed port does.
    pub(crate) fn ends_connection(self, tcp: bool) -> bool {
        match self {
            FaultKind::Disconnected => true,
            FaultKind::Timeout | FaultKind::Protocol => tcp,
            FaultKind::Exception | FaultKind::BadFrame => false,
        }
    }
}

/// A failed request: its kind and what the sensors' `error` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fault {
    pub kind: FaultKind,
    pub message: String,
}

/// The name of a Modbus exception code (application protocol 1.1b3, 7).
pub(crate) fn exception_name(code: u8) -> String {
    let name = match code {
        1 => "illegal function",
        2 => "illegal data address",
        3 => "illegal data value",
        4 => "server device failure",
        5 => "acknowledge",
        6 => "server device busy",
        8 => "memory parity error",
        10 => "gateway path unavailable",
        11 => "gateway target device failed to respond",
        _ => return format!("exception {code}"),
    };
    format!("{name} (exception {code})")
}

/// A timeout, told apart from a corrupted reply: on RTU the framing drops
/// a frame whose CRC fails and waits on, so a request that timed out after
/// bytes came back met a bad frame, not silence.
pub(crate) fn timeout_fault(timeout: Duration, bytes_since_request: u64) -> Fault {
    let ms = timeout.as_millis();
    if bytes_since_request > 0 {
        Fault {
            kind: FaultKind::BadFrame,
            message: format!(
                "no valid reply within {ms} ms ({bytes_since_request} bytes of a bad frame: CRC error)"
            ),
        }
    } else {
        Fault {
            kind: FaultKind::Timeout,
            message: format!("no reply within {ms} ms"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::{Order, ValueType};
    use super::*;

    fn read(name: &str, table: Table, address: u16, ty: ValueType, every_ms: u64) -> SensorRead {
        SensorRead {
            name: name.into(),
            unit: 1,
            table,
            address,
            codec: Codec {
                value_type: ty,
                word_order: Order::Big,
                byte_order: Order::Big,
                scale: 1.0,
                offset: 0.0,
            },
            every: Duration::from_millis(every_ms),
        }
    }

    fn spans(g: &PollGroup) -> Vec<(Table, u16, u16)> {
        g.requests
            .iter()
            .map(|r| (r.table, r.start, r.count))
            .collect()
    }

    #[test]
    fn sensors_of_one_rate_and_table_are_read_in_as_few_requests_as_gaps_and_length_allow() {
        use Table::*;
        use ValueType::*;
        let sensors = [
            read("f32_at_10", Holding, 10, F32, 100),
            read("u16_at_0", Holding, 0, U16, 100),
            read("u16_at_5", Holding, 5, U16, 100),
            // 20 registers after the last: beyond max_gap 8
            read("far", Holding, 32, U16, 100),
            read("in", Input, 0, I16, 100),
            read("coil_3", Coil, 3, Bool, 100),
            read("coil_0", Coil, 0, Bool, 100),
            read("slow", Holding, 1, U16, 1000),
        ];
        let groups = plan(&sensors, 125, 8);
        assert_eq!(groups.len(), 2, "one group per rate");
        assert_eq!(groups[0].every, Duration::from_millis(100));
        assert_eq!(
            spans(&groups[0]),
            [
                (Holding, 0, 12),
                (Holding, 32, 1),
                (Input, 0, 1),
                (Coil, 0, 4)
            ]
        );
        assert_eq!(spans(&groups[1]), [(Holding, 1, 1)]);
        let first = &groups[0].requests[0];
        let words: Vec<u16> = (0..12)
            .map(|i| {
                if i == 10 {
                    0x42C8
                } else if i == 11 {
                    0x8000
                } else {
                    i
                }
            })
            .collect();
        let values: Vec<(&str, Option<f64>)> = first.values_in_words(&words).collect();
        assert_eq!(
            values,
            [
                ("u16_at_0", Some(0.0)),
                ("u16_at_5", Some(5.0)),
                ("f32_at_10", Some(100.25))
            ]
        );
        let bits = [true, false, false, true];
        let coils: Vec<_> = groups[0].requests[3].values_in_bits(&bits).collect();
        assert_eq!(coils, [("coil_0", Some(1.0)), ("coil_3", Some(1.0))]);
    }

    #[test]
    fn a_request_never_exceeds_its_bound() {
        let sensors: Vec<SensorRead> = (0..100u16)
            .map(|i| read(&format!("s{i}"), Table::Holding, i * 2, ValueType::U32, 10))
            .collect();
        let groups = plan(&sensors, 32, 0);
        assert!(groups[0].requests.iter().all(|r| r.count <= 32));
        assert_eq!(groups[0].requests.len(), 7, "200 registers in 32s");
        // every sensor is read once
        let slots: usize = groups[0].requests.iter().map(|r| r.slots.len()).sum();
        assert_eq!(slots, 100);
        // the protocol's own bound holds whatever is configured
        let groups = plan(&sensors, 1000, 0);
        assert!(groups[0].requests.iter().all(|r| r.count <= 125));
    }

    #[tokio::test(start_paused = true)]
    async fn the_poller_serves_each_group_at_its_rate_and_counts_polls_it_could_not_make() {
        let sensors = [
            read("a", Table::Holding, 0, ValueType::U16, 100),
            read("b", Table::Input, 0, ValueType::U16, 100),
            read("c", Table::Holding, 0, ValueType::U16, 250),
        ];
        let groups = plan(&sensors, 125, 0);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut p = Poller::new(&groups, t0);
        assert_eq!(p.take(t0), Some((0, 0)));
        assert_eq!(p.take(t0), Some((0, 1)));
        assert_eq!(p.take(t0), Some((1, 0)));
        assert_eq!(p.take(t0), None);
        assert_eq!(p.next_wake(t0), Some(at(100)));
        assert_eq!(p.take(at(100)), Some((0, 0)));
        // the group's second request still waits at its next period: missed
        assert_eq!(p.take(at(200)), Some((0, 1)));
        assert_eq!(p.missed(), 1);
        // far behind (a link stalled for a second): each period missed counted once
        assert_eq!(p.take(at(1210)), Some((0, 0)));
        assert!(p.missed() >= 10, "{}", p.missed());
        assert_eq!(
            p.next_wake(at(1210)),
            Some(at(1210)),
            "its other request waits"
        );
        assert_eq!(p.take(at(1210)), Some((0, 1)));
        assert_eq!(p.take(at(1210)), Some((1, 0)));
        assert_eq!(p.next_wake(at(1210)), Some(at(1250)));
    }

    #[test]
    fn a_write_takes_the_function_its_mode_and_type_ask_for() {
        use crate::hw::config::{ModbusPoint, WriteMode};
        let point = |table, ty| ModbusPoint {
            unit: 1,
            table,
            address: 7,
            codec: Codec {
                scale: 0.01,
                ..Codec::plain(ty)
            },
        };
        let hz = point(Table::Holding, ValueType::U16);
        assert_eq!(
            WriteOp::new(&hz, WriteMode::Single, 50.0),
            Ok(WriteOp::Register(5000))
        );
        assert_eq!(
            WriteOp::new(&hz, WriteMode::Multiple, 50.0),
            Ok(WriteOp::Registers(vec![5000]))
        );
        let wide = point(Table::Holding, ValueType::U32);
        assert_eq!(
            WriteOp::new(&wide, WriteMode::Multiple, 700.0),
            Ok(WriteOp::Registers(vec![1, 4464]))
        );
        assert!(WriteOp::Registers(vec![1, 4464]).matches_words(&[1, 4464]));
        assert!(!WriteOp::Registers(vec![1, 4464]).matches_words(&[1]));
        let coil = ModbusPoint {
            codec: Codec::plain(ValueType::Bool),
            ..point(Table::Coil, ValueType::Bool)
        };
        assert_eq!(
            WriteOp::new(&coil, WriteMode::Single, 1.0),
            Ok(WriteOp::Coil(true))
        );
        assert!(WriteOp::Coil(true).matches_bits(&[true, false]));
        assert!(
            WriteOp::new(&hz, WriteMode::Single, 700.0).is_err(),
            "70000 raw is no u16"
        );
    }

    #[test]
    fn the_latency_ring_keeps_the_latest_and_ranks_them() {
        let mut ring = LatencyRing::default();
        assert_eq!(ring.percentile(0.5), 0);
        for us in 1..=100 {
            ring.push(us);
        }
        assert_eq!((ring.percentile(0.5), ring.percentile(0.99)), (50, 99));
        for _ in 0..LatencyRing::CAPACITY {
            ring.push(7);
        }
        assert_eq!(ring.percentile(0.99), 7, "the oldest are gone");
    }

    #[test]
    fn faults_say_what_happened_and_whether_to_reconnect() {
        assert_eq!(exception_name(2), "illegal data address (exception 2)");
        assert_eq!(exception_name(6), "server device busy (exception 6)");
        assert_eq!(exception_name(99), "exception 99");
        let silent = timeout_fault(Duration::from_millis(200), 0);
        assert_eq!(silent.kind, FaultKind::Timeout);
        assert_eq!(silent.message, "no reply within 200 ms");
        assert_eq!(
            timeout_fault(Duration::from_millis(200), 7).kind,
            FaultKind::BadFrame
        );
        assert!(FaultKind::Timeout.ends_connection(true));
        assert!(!FaultKind::Timeout.ends_connection(false));
        assert!(!FaultKind::Exception.ends_connection(true));
        assert!(FaultKind::Disconnected.ends_connection(false));
        assert!(FaultKind::BadFrame.retryable() && !FaultKind::Exception.retryable());
    }
}
