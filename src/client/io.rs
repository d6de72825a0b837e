//! A client socket with its read buffer, for the sequential phases (startup, login).

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio_util::io::poll_read_buf;

use super::SessionError;
use crate::net::Stream;
use crate::wire::{self, ErrorResponse, Frame};

pub struct ClientIo {
    pub stream: Stream,
    pub rbuf: BytesMut,
    pub max_message: usize,
}

impl ClientIo {
    pub fn new(stream: Stream, max_message: usize) -> Self {
        ClientIo {
            stream,
            rbuf: BytesMut::with_capacity(wire::frame::READ_ROOM),
            max_message,
        }
    }

    /// Reads more bytes; end of stream is [`SessionError::Gone`].
    pub async fn fill(&mut self) -> Result<(), SessionError> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// [`fill`](Self::fill), polled by hand: for a wait that reads the client meanwhile in
    /// the same poll.
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SessionError>> {
        wire::room_for_read(&mut self.rbuf);
        let read = ready!(poll_read_buf(
            Pin::new(&mut self.stream),
            cx,
            &mut self.rbuf
        ))?;
        Poll::Ready(match read {
            0 => Err(SessionError::Gone),
            _ => Ok(()),
        })
    }

    /// Reads one whole tagged message.
    pub async fn read_frame(&mut self) -> Result<Frame, SessionError> {
        loop {
            if let Some(frame) = wire::decode_frame(&mut self.rbuf, self.max_message)? {
                return Ok(frame);
            }
            self.fill().await?;
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), SessionError> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Sends an error and whatever is queued before it, giving up after a few seconds so a
    /// client that reads nothing cannot hold the session.
    pub async fn send_error(&mut self, pending: &[u8], err: &ErrorResponse) {
        let mut out = BytesMut::from(pending);
        wire::encode_error(&mut out, err);
        let write = async {
            let _ = self.stream.write_all(&out).await;
            let _ = self.stream.shutdown().await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
    }
}
