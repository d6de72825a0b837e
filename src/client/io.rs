//! A client socket with its read buffer, for the sequential phases (startup, login).

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        wire::room_for_read(&mut self.rbuf);
        match self.stream.read_buf(&mut self.rbuf).await? {
            0 => Err(SessionError::Gone),
            _ => Ok(()),
        }
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
