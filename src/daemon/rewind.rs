//! A connection whose first bytes were read to see what it is (a stop?)
//! before it was seated: they are given back, in order, to whoever reads
//! it next (the HTTP server), then the connection itself.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};

use crate::api::connections::{Arrival, classify};

/// The most read before deciding: longer than any stop's request line start.
pub(super) const FIRST_BYTES_MOST: usize = 64;

/// `inner`, with `prefix` read first.
pub(super) struct Rewind<I> {
    prefix: Vec<u8>,
    at: usize,
    inner: I,
}

impl<I> Rewind<I> {
    pub(super) fn new(prefix: Vec<u8>, inner: I) -> Self {
        Rewind {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let rest = &this.prefix[this.at..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Reads the connection's first bytes (after `first`, read already) until
/// they say whether its first request is a stop (or the peer closes).
/// `None`: nothing came at all.
pub(super) async fn first_bytes<I: AsyncRead + Unpin>(
    io: &mut I,
    mut first: Vec<u8>,
) -> Option<(Vec<u8>, Arrival)> {
    if let Some(arrival) = classify(&first) {
        return Some((first, arrival));
    }
    let mut buf = [0u8; FIRST_BYTES_MOST];
    loop {
        let want = FIRST_BYTES_MOST.saturating_sub(first.len()).max(1);
        let n = io.read(&mut buf[..want]).await.unwrap_or(0);
        if n == 0 {
            // Closed (or failed) before a decision: whatever came is served
            // as it is (hyper answers a partial request).
            return (!first.is_empty()).then_some((first, Arrival::Other));
        }
        first.extend_from_slice(&buf[..n]);
        if let Some(arrival) = classify(&first) {
            return Some((first, arrival));
        }
        if first.len() >= FIRST_BYTES_MOST {
            return Some((first, Arrival::Other));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test]
    async fn what_was_read_first_is_read_again_then_the_rest() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client
            .write_all(b"POST /v1/estop HTTP/1.1\r\n")
            .await
            .unwrap();
        let (first, arrival) = first_bytes(&mut server, Vec::new()).await.unwrap();
        assert_eq!(arrival, Arrival::Stop);
        client.write_all(b"host: x\r\n\r\n").await.unwrap();
        drop(client);
        let mut all = Vec::new();
        Rewind::new(first, server)
            .read_to_end(&mut all)
            .await
            .unwrap();
        assert_eq!(all, b"POST /v1/estop HTTP/1.1\r\nhost: x\r\n\r\n");
    }

    #[tokio::test]
    async fn a_trickled_request_line_is_waited_for_and_nothing_is_none() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move { first_bytes(&mut server, Vec::new()).await });
        for piece in [&b"PO"[..], b"ST /v1/fl", b"eet/estop "] {
            client.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        let (first, arrival) = reader.await.unwrap().unwrap();
        assert_eq!(arrival, Arrival::Stop);
        assert!(first.starts_with(b"POST /v1/fleet/estop "));
        let (client, mut server) = tokio::io::duplex(64);
        drop(client);
        assert!(first_bytes(&mut server, Vec::new()).await.is_none());
    }
}
