//! Password authentication math (MD5 and SCRAM-SHA-256), with no I/O.
//!
//! Both sides of SCRAM-SHA-256 (RFC 5802 / RFC 7677) are here: [`ScramServer`] checks a
//! client against a stored [`ScramSecret`], [`ScramClient`] logs in to a server either with a
//! password or with the raw keys recovered from a client's successful exchange.

use std::fmt;
use std::fmt::Write as _;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use md5::Md5;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Name of the only SASL mechanism supported.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";
/// Iteration count used for mock secrets (PostgreSQL's default `scram_iterations`).
pub const DEFAULT_SCRAM_ITERATIONS: u32 = 4096;
/// Largest iteration count a server may ask a client to compute.
pub const MAX_SCRAM_ITERATIONS: u32 = 100_000_000;
/// Length of a mock secret's salt.
const MOCK_SALT_LEN: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// Why a SCRAM exchange failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// The message does not follow the SCRAM syntax.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The client asked for channel binding, which was not offered.
    #[error("the client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data")]
    ChannelBindingNotSupported,
    /// The channel-binding data of the final message differs from the first message's header.
    #[error("SCRAM channel binding check failed")]
    ChannelBindingMismatch,
    /// The nonce does not continue the one of the previous message.
    #[error("SCRAM nonce mismatch")]
    NonceMismatch,
    /// The client proof is wrong.
    #[error("password authentication failed")]
    WrongPassword,
    /// The server asked for an iteration count of zero or above [`MAX_SCRAM_ITERATIONS`].
    #[error("invalid SCRAM iteration count")]
    BadIterations,
    /// The server's signature is wrong: it does not know the password.
    #[error("SCRAM server signature does not match")]
    ServerSignatureMismatch,
    /// The server reported an error in its final message.
    #[error("SCRAM authentication error from server: {0}")]
    ServerError(String),
    /// A message arrived at a step where it was not expected.
    #[error("SCRAM message received out of order")]
    OutOfOrder,
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of every length, so this constructor cannot fail.
    let Ok(mut mac) = <HmacSha256 as Mac>::new_from_slice(key) else {
        return [0; 32];
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn xor(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b)) {
        *o = x ^ y;
    }
    out
}

/// Equality whose running time does not depend on where the inputs differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0 && a.len() == b.len()
}

fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn md5_hex(parts: &[&[u8]]) -> String {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    to_hex(&h.finalize())
}

/// The stored MD5 secret of a role: `"md5"` + hex(md5(password + user)).
pub fn md5_secret(user: &str, password: &str) -> String {
    format!("md5{}", md5_hex(&[password.as_bytes(), user.as_bytes()]))
}

/// The client's answer to an MD5 challenge from the stored secret: `"md5"` +
/// hex(md5(hex part of the secret + salt)).
pub fn md5_response(md5_secret: &str, salt: [u8; 4]) -> String {
    let hex = md5_secret.strip_prefix("md5").unwrap_or(md5_secret);
    format!("md5{}", md5_hex(&[hex.as_bytes(), &salt]))
}

/// The client's answer to an MD5 challenge from the password.
pub fn md5_response_from_password(user: &str, password: &str, salt: [u8; 4]) -> String {
    md5_response(&md5_secret(user, password), salt)
}

/// Checks a client's MD5 answer against the stored secret, in constant time.
pub fn md5_verify(md5_secret: &str, salt: [u8; 4], response: &[u8]) -> bool {
    ct_eq(md5_response(md5_secret, salt).as_bytes(), response)
}

/// A random salt for an MD5 challenge.
pub fn random_md5_salt() -> [u8; 4] {
    let mut salt = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut salt);
    salt
}

/// A random SCRAM nonce: 18 random bytes in base64.
pub fn random_nonce() -> String {
    let mut raw = [0u8; 18];
    rand::thread_rng().fill_bytes(&mut raw);
    B64.encode(raw)
}

/// ClientKey and ServerKey derived from a password.
fn keys_from_password(password: &str, salt: &[u8], iterations: u32) -> ([u8; 32], [u8; 32]) {
    // Like PostgreSQL: normalise with SASLprep, or use the bytes as they are when the
    // password is not a valid SASLprep string.
    let prepared = stringprep::saslprep(password);
    let bytes = match &prepared {
        Ok(p) => p.as_bytes(),
        Err(_) => password.as_bytes(),
    };
    let mut salted = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(bytes, salt, iterations.max(1), &mut salted);
    (
        hmac(&salted, &[b"Client Key"]),
        hmac(&salted, &[b"Server Key"]),
    )
}

/// A role's stored SCRAM-SHA-256 secret, as in `pg_authid.rolpassword`.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramSecret {
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// Salt.
    pub salt: Vec<u8>,
    /// H(ClientKey).
    pub stored_key: [u8; 32],
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: [u8; 32],
}

impl fmt::Debug for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramSecret")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

fn decode_key(b64: &str) -> Option<[u8; 32]> {
    B64.decode(b64).ok()?.try_into().ok()
}

impl ScramSecret {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64 fields).
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix("SCRAM-SHA-256$")?;
        let (iter_salt, keys) = rest.split_once('$')?;
        let (iterations, salt) = iter_salt.split_once(':')?;
        let (stored_key, server_key) = keys.split_once(':')?;
        Some(Self {
            iterations: iterations.parse().ok().filter(|&i| i > 0)?,
            salt: B64.decode(salt).ok()?,
            stored_key: decode_key(stored_key)?,
            server_key: decode_key(server_key)?,
        })
    }

    /// Computes the secret of `password` (an iteration count of 0 is treated as 1).
    pub fn from_password(password: &str, salt: &[u8], iterations: u32) -> Self {
        let (client_key, server_key) = keys_from_password(password, salt, iterations);
        Self {
            iterations: iterations.max(1),
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key,
        }
    }

    /// A deterministic secret for a role that does not exist, so that the exchange looks the
    /// same as for a real role and then fails. `seed_key` should be random per process.
    pub fn mock(seed_key: &[u8], user: &str) -> Self {
        Self {
            iterations: DEFAULT_SCRAM_ITERATIONS,
            salt: mock_salt(seed_key, user),
            stored_key: hmac(seed_key, &[b"stored", user.as_bytes()]),
            server_key: hmac(seed_key, &[b"server", user.as_bytes()]),
        }
    }

    /// The secret a SCRAM exchange uses for a role whose password pgward holds as plain
    /// text: the salt and iteration count a mock for the role would show, so that every try
    /// shows the same, and a role that exists cannot be told from one that does not.
    pub fn of_plain(seed_key: &[u8], user: &str, password: &str) -> Self {
        let salt = mock_salt(seed_key, user);
        Self::from_password(password, &salt, DEFAULT_SCRAM_ITERATIONS)
    }
}

/// The salt of [`ScramSecret::mock`] and [`ScramSecret::of_plain`] for `user`.
fn mock_salt(seed_key: &[u8], user: &str) -> Vec<u8> {
    let salt = hmac(seed_key, &[b"salt", user.as_bytes()]);
    salt.iter().take(MOCK_SALT_LEN).copied().collect()
}

impl fmt::Display for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

/// Strips `prefix` from a SCRAM attribute.
fn attr<'a>(
    part: Option<&'a str>,
    prefix: &str,
    what: &'static str,
) -> Result<&'a str, ScramError> {
    part.and_then(|p| p.strip_prefix(prefix))
        .ok_or(ScramError::Malformed(what))
}

fn utf8(msg: &[u8]) -> Result<&str, ScramError> {
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("message is not valid UTF-8"))
}

/// A nonce is printable ASCII without commas.
fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// Splits a client-first-message into its GS2 header (`n,,` or `y,,`) and the bare message.
fn split_gs2(msg: &str) -> Result<(&str, &str), ScramError> {
    let mut parts = msg.splitn(3, ',');
    let flag = parts.next().unwrap_or_default();
    match flag {
        "n" | "y" => {}
        f if f.starts_with("p=") => return Err(ScramError::ChannelBindingNotSupported),
        _ => return Err(ScramError::Malformed("unexpected channel-binding flag")),
    }
    let authzid = parts.next().ok_or(ScramError::Malformed(
        "missing authorization identity field",
    ))?;
    if !authzid.is_empty() {
        return Err(ScramError::Malformed(
            "authorization identities are not supported",
        ));
    }
    let bare = parts.next().ok_or(ScramError::Malformed("missing nonce"))?;
    let header = msg
        .get(..msg.len() - bare.len())
        .ok_or(ScramError::Malformed("bad header"))?;
    Ok((header, bare))
}

/// The client nonce of a client-first-message-bare (the user name is ignored, as PostgreSQL
/// takes it from the startup packet).
fn client_nonce(bare: &str) -> Result<&str, ScramError> {
    let mut parts = bare.split(',');
    let user = parts.next();
    if user.is_some_and(|u| u.starts_with("m=")) {
        return Err(ScramError::Malformed("unsupported SCRAM extension"));
    }
    attr(user, "n=", "missing user name attribute")?;
    let nonce = attr(parts.next(), "r=", "missing nonce attribute")?;
    if !valid_nonce(nonce) {
        return Err(ScramError::Malformed("invalid nonce"));
    }
    Ok(nonce)
}

/// What the server remembers between its two messages.
#[derive(Clone, Debug)]
struct ServerExchange {
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

#[derive(Clone, Debug)]
enum ServerState {
    AwaitFirst,
    AwaitFinal(ServerExchange),
    Done,
}

/// Result of a successful server-side exchange.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramOutcome {
    /// The server-final-message to send in AuthenticationSASLFinal.
    pub server_final: Vec<u8>,
    /// The client's ClientKey, recovered from its proof; with the secret's ServerKey it lets
    /// a [`ScramClient`] log in to a server holding the same secret.
    pub client_key: [u8; 32],
}

impl fmt::Debug for ScramOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramOutcome").finish_non_exhaustive()
    }
}

/// Server side of SCRAM-SHA-256 (without channel binding). Any error ends the exchange.
#[derive(Debug)]
pub struct ScramServer {
    secret: ScramSecret,
    server_nonce: String,
    state: ServerState,
}

impl ScramServer {
    /// Starts an exchange against `secret`; `server_nonce` should come from [`random_nonce`].
    pub fn new(secret: ScramSecret, server_nonce: String) -> Self {
        Self {
            secret,
            server_nonce,
            state: ServerState::AwaitFirst,
        }
    }

    /// Handles the client-first-message and returns the server-first-message.
    pub fn first(&mut self, client_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let ServerState::AwaitFirst = std::mem::replace(&mut self.state, ServerState::Done) else {
            return Err(ScramError::OutOfOrder);
        };
        let (gs2_header, bare) = split_gs2(utf8(client_first)?)?;
        let nonce = format!("{}{}", client_nonce(bare)?, self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.secret.salt),
            self.secret.iterations
        );
        let out = server_first.clone().into_bytes();
        self.state = ServerState::AwaitFinal(ServerExchange {
            gs2_header: gs2_header.to_owned(),
            client_first_bare: bare.to_owned(),
            server_first,
            nonce,
        });
        Ok(out)
    }

    /// Handles the client-final-message: checks channel binding, nonce and proof.
    pub fn finish(&mut self, client_final: &[u8]) -> Result<ScramOutcome, ScramError> {
        let ServerState::AwaitFinal(ex) = std::mem::replace(&mut self.state, ServerState::Done)
        else {
            return Err(ScramError::OutOfOrder);
        };
        let msg = utf8(client_final)?;
        let (without_proof, proof) = msg
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("missing proof attribute"))?;
        check_final_attrs(&ex, without_proof)?;
        let proof = decode_key(proof).ok_or(ScramError::Malformed("invalid proof"))?;
        let auth_message = format!(
            "{},{},{}",
            ex.client_first_bare, ex.server_first, without_proof
        );
        let signature = hmac(&self.secret.stored_key, &[auth_message.as_bytes()]);
        let client_key = xor(&proof, &signature);
        if !ct_eq(&sha256(&client_key), &self.secret.stored_key) {
            return Err(ScramError::WrongPassword);
        }
        let server_sig = hmac(&self.secret.server_key, &[auth_message.as_bytes()]);
        Ok(ScramOutcome {
            server_final: format!("v={}", B64.encode(server_sig)).into_bytes(),
            client_key,
        })
    }
}

/// Checks the channel-binding echo and the nonce of a client-final-message.
fn check_final_attrs(ex: &ServerExchange, without_proof: &str) -> Result<(), ScramError> {
    let mut parts = without_proof.split(',');
    let binding = attr(parts.next(), "c=", "missing channel binding attribute")?;
    let binding = B64
        .decode(binding)
        .map_err(|_| ScramError::Malformed("invalid channel binding data"))?;
    if binding != ex.gs2_header.as_bytes() {
        return Err(ScramError::ChannelBindingMismatch);
    }
    let nonce = attr(parts.next(), "r=", "missing nonce attribute")?;
    if nonce != ex.nonce {
        return Err(ScramError::NonceMismatch);
    }
    Ok(())
}

/// What a [`ScramClient`] proves knowledge of.
#[derive(Clone, PartialEq, Eq)]
pub enum ScramCredential {
    /// The password itself.
    Password(String),
    /// ClientKey and ServerKey, e.g. recovered from a client's exchange with us.
    Keys {
        /// ClientKey.
        client_key: [u8; 32],
        /// ServerKey.
        server_key: [u8; 32],
    },
}

impl fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Password(_) => f.write_str("Password(..)"),
            Self::Keys { .. } => f.write_str("Keys(..)"),
        }
    }
}

#[derive(Clone, Debug)]
enum ClientState {
    Initial,
    AwaitFinal { server_signature: [u8; 32] },
}

/// Client side of SCRAM-SHA-256 (without channel binding).
#[derive(Debug)]
pub struct ScramClient {
    credential: ScramCredential,
    client_nonce: String,
    client_first_bare: String,
    state: ClientState,
}

/// Escapes `=` and `,` in a SCRAM user name.
fn sasl_name(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    /// Starts an exchange; `client_nonce` should come from [`random_nonce`].
    pub fn new(credential: ScramCredential, client_nonce: String) -> Self {
        let client_first_bare = format!("n=,r={client_nonce}");
        Self {
            credential,
            client_nonce,
            client_first_bare,
            state: ClientState::Initial,
        }
    }

    /// Puts `user` in the client-first-message (PostgreSQL ignores it and sends none).
    pub fn with_username(mut self, user: &str) -> Self {
        self.client_first_bare = format!("n={},r={}", sasl_name(user), self.client_nonce);
        self
    }

    /// The client-first-message (no channel binding).
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Handles the server-first-message and returns the client-final-message.
    pub fn handle_server_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, ScramError> {
        let ClientState::Initial = self.state else {
            return Err(ScramError::OutOfOrder);
        };
        let server_first = utf8(msg)?;
        let (nonce, salt, iterations) = parse_server_first(server_first)?;
        if nonce.len() <= self.client_nonce.len() || !nonce.starts_with(&self.client_nonce) {
            return Err(ScramError::NonceMismatch);
        }
        let (client_key, server_key) = match &self.credential {
            ScramCredential::Password(pw) => keys_from_password(pw, &salt, iterations),
            ScramCredential::Keys {
                client_key,
                server_key,
            } => (*client_key, *server_key),
        };
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, server_first, without_proof
        );
        let signature = hmac(&sha256(&client_key), &[auth_message.as_bytes()]);
        let proof = xor(&client_key, &signature);
        self.state = ClientState::AwaitFinal {
            server_signature: hmac(&server_key, &[auth_message.as_bytes()]),
        };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final-message: the server must prove it knows the secret.
    pub fn handle_server_final(&self, msg: &[u8]) -> Result<(), ScramError> {
        let ClientState::AwaitFinal { server_signature } = &self.state else {
            return Err(ScramError::OutOfOrder);
        };
        let first = utf8(msg)?.split(',').next();
        if let Some(err) = first.and_then(|f| f.strip_prefix("e=")) {
            return Err(ScramError::ServerError(err.to_owned()));
        }
        let verifier = attr(first, "v=", "missing verifier attribute")?;
        let verifier = B64
            .decode(verifier)
            .map_err(|_| ScramError::Malformed("invalid server signature"))?;
        if !ct_eq(&verifier, server_signature) {
            return Err(ScramError::ServerSignatureMismatch);
        }
        Ok(())
    }
}

/// Nonce, salt and iteration count of a server-first-message.
fn parse_server_first(msg: &str) -> Result<(&str, Vec<u8>, u32), ScramError> {
    let mut parts = msg.split(',');
    let first = parts.next();
    if first.is_some_and(|f| f.starts_with("m=")) {
        return Err(ScramError::Malformed("unsupported SCRAM extension"));
    }
    let nonce = attr(first, "r=", "missing nonce attribute")?;
    if !valid_nonce(nonce) {
        return Err(ScramError::Malformed("invalid nonce"));
    }
    let salt = B64
        .decode(attr(parts.next(), "s=", "missing salt attribute")?)
        .map_err(|_| ScramError::Malformed("invalid salt"))?;
    let iterations = attr(parts.next(), "i=", "missing iteration count attribute")?
        .parse::<u32>()
        .map_err(|_| ScramError::BadIterations)?;
    if iterations == 0 || iterations > MAX_SCRAM_ITERATIONS {
        return Err(ScramError::BadIterations);
    }
    Ok((nonce, salt, iterations))
}

#[cfg(test)]
mod tests;
