use super::*;

const PENCIL_SECRET: &str = "SCRAM-SHA-256$4096:AAECAwQFBgcICQoLDA0ODw==$zHCdol2044/ZyWzPLi7oxApCkamKw9Z+E4U/QApd/5Y=:dd5peBOitVnLNFu7VmwP+HiDaaw4OUCv396eVCWhYiE=";

// RFC 7677, section 3.
const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_SALT_B64: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_FIRST: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_secret() -> ScramSecret {
    let salt = B64.decode(RFC_SALT_B64).unwrap();
    ScramSecret::from_password("pencil", &salt, 4096)
}

#[test]
fn md5_known_values() {
    let secret = md5_secret("postgres", "postgres");
    assert_eq!(secret, "md53175bce1d3201d16594cebf9d7eb3f9d");
    let response = md5_response(&secret, [1, 2, 3, 4]);
    assert_eq!(response, "md568be9ed08db75f318087ab337aaea044");
    assert_eq!(
        md5_response_from_password("postgres", "postgres", [1, 2, 3, 4]),
        response
    );
    assert!(md5_verify(&secret, [1, 2, 3, 4], response.as_bytes()));
    assert!(!md5_verify(&secret, [1, 2, 3, 5], response.as_bytes()));
    assert!(!md5_verify(&secret, [1, 2, 3, 4], b"md5"));
}

#[test]
fn secret_matches_postgres_math() {
    let s = ScramSecret::from_password("pencil", &(0u8..16).collect::<Vec<_>>(), 4096);
    assert_eq!(s.to_string(), PENCIL_SECRET);
    assert_eq!(ScramSecret::parse(PENCIL_SECRET), Some(s));
}

#[test]
fn secret_parse_rejections() {
    for bad in [
        "",
        "md5abc",
        "SCRAM-SHA-256$0:AAAA$zHCdol2044/ZyWzPLi7oxApCkamKw9Z+E4U/QApd/5Y=:dd5peBOitVnLNFu7VmwP+HiDaaw4OUCv396eVCWhYiE=",
        "SCRAM-SHA-256$4096:!!$zHCdol2044/ZyWzPLi7oxApCkamKw9Z+E4U/QApd/5Y=:dd5peBOitVnLNFu7VmwP+HiDaaw4OUCv396eVCWhYiE=",
        "SCRAM-SHA-256$4096:AAAA$AAAA:dd5peBOitVnLNFu7VmwP+HiDaaw4OUCv396eVCWhYiE=",
        "SCRAM-SHA-256$4096:AAAA$zHCdol2044/ZyWzPLi7oxApCkamKw9Z+E4U/QApd/5Y=",
    ] {
        assert_eq!(ScramSecret::parse(bad), None, "{bad}");
    }
}

#[test]
fn saslprep_applies_or_falls_back() {
    let salt = b"salt";
    assert_eq!(
        ScramSecret::from_password("a\u{00A0}b", salt, 1),
        ScramSecret::from_password("a b", salt, 1)
    );
    // A prohibited character: the raw bytes are used, the result is stable and distinct.
    let raw = ScramSecret::from_password("a\u{0007}", salt, 1);
    assert_eq!(raw, ScramSecret::from_password("a\u{0007}", salt, 1));
    assert_ne!(raw, ScramSecret::from_password("a", salt, 1));
}

#[test]
fn rfc7677_server_side() {
    let mut server = ScramServer::new(rfc_secret(), RFC_SERVER_NONCE.into());
    let first = server.first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
    assert_eq!(first, RFC_SERVER_FIRST.as_bytes());
    let outcome = server.finish(RFC_CLIENT_FINAL.as_bytes()).unwrap();
    assert_eq!(outcome.server_final, RFC_SERVER_FINAL.as_bytes());
}

#[test]
fn rfc7677_client_side() {
    let cred = ScramCredential::Password("pencil".into());
    let mut client = ScramClient::new(cred, RFC_CLIENT_NONCE.into()).with_username("user");
    assert_eq!(client.client_first(), RFC_CLIENT_FIRST.as_bytes());
    let last = client
        .handle_server_first(RFC_SERVER_FIRST.as_bytes())
        .unwrap();
    assert_eq!(last, RFC_CLIENT_FINAL.as_bytes());
    client
        .handle_server_final(RFC_SERVER_FINAL.as_bytes())
        .unwrap();
    assert_eq!(
        client.handle_server_final(b"v=6rrjTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
        Err(ScramError::ServerSignatureMismatch)
    );
    assert_eq!(
        client.handle_server_final(b"e=invalid-proof"),
        Err(ScramError::ServerError("invalid-proof".into()))
    );
}

/// Runs a whole exchange; returns the server's outcome or the first error.
fn exchange(secret: &ScramSecret, client: &mut ScramClient) -> Result<ScramOutcome, ScramError> {
    let mut server = ScramServer::new(secret.clone(), random_nonce());
    let server_first = server.first(&client.client_first())?;
    let client_final = client.handle_server_first(&server_first)?;
    let outcome = server.finish(&client_final)?;
    client.handle_server_final(&outcome.server_final)?;
    Ok(outcome)
}

#[test]
fn roundtrip_with_password_then_keys() {
    let secret = ScramSecret::from_password("s3cret", b"0123456789abcdef", 64);
    let mut client = ScramClient::new(ScramCredential::Password("s3cret".into()), random_nonce());
    let outcome = exchange(&secret, &mut client).unwrap();
    let keys = ScramCredential::Keys {
        client_key: outcome.client_key,
        server_key: secret.server_key,
    };
    let mut relayed = ScramClient::new(keys, random_nonce());
    exchange(&secret, &mut relayed).unwrap();
}

#[test]
fn wrong_password_and_mock_fail() {
    let secret = ScramSecret::from_password("right", b"salt", 16);
    let mut client = ScramClient::new(ScramCredential::Password("wrong".into()), random_nonce());
    assert_eq!(
        exchange(&secret, &mut client).unwrap_err(),
        ScramError::WrongPassword
    );
    let mock = ScramSecret::mock(b"process key", "nobody");
    assert_eq!(mock, ScramSecret::mock(b"process key", "nobody"));
    assert_ne!(mock.salt, ScramSecret::mock(b"process key", "other").salt);
    assert_eq!(mock.salt.len(), 16);
    for pw in ["", "nobody", "right"] {
        let mut client = ScramClient::new(ScramCredential::Password(pw.into()), random_nonce());
        assert_eq!(
            exchange(&mock, &mut client).unwrap_err(),
            ScramError::WrongPassword
        );
    }
}

#[test]
fn server_gs2_handling() {
    let secret = rfc_secret();
    let mut s = ScramServer::new(secret.clone(), "srv".into());
    assert_eq!(
        s.first(b"p=tls-server-end-point,,n=,r=abc"),
        Err(ScramError::ChannelBindingNotSupported)
    );
    assert_eq!(s.first(b"n,,n=,r=abc"), Err(ScramError::OutOfOrder));
    for bad in [
        &b"n,a=admin,n=,r=abc"[..],
        b"x,,n=,r=abc",
        b"n,,m=ext,n=,r=abc",
        b"n,,n=,r=",
        b"n,,n=",
    ] {
        let mut s = ScramServer::new(secret.clone(), "srv".into());
        assert!(matches!(s.first(bad), Err(ScramError::Malformed(_))));
    }
    let mut s = ScramServer::new(secret.clone(), "srv".into());
    s.first(b"y,,n=x,r=abc").unwrap();
    let final_n = b"c=biws,r=abcsrv,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    assert_eq!(s.finish(final_n), Err(ScramError::ChannelBindingMismatch));
    let mut s = ScramServer::new(secret, "srv".into());
    s.first(b"n,,n=x,r=abc").unwrap();
    let wrong_nonce = b"c=biws,r=abcsrx,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    assert_eq!(s.finish(wrong_nonce), Err(ScramError::NonceMismatch));
    assert_eq!(s.finish(wrong_nonce), Err(ScramError::OutOfOrder));
}

#[test]
fn client_rejects_bad_server_first() {
    let new = || ScramClient::new(ScramCredential::Password("p".into()), "abc".into());
    assert_eq!(
        new().handle_server_first(b"r=xyzdef,s=AAAA,i=1"),
        Err(ScramError::NonceMismatch)
    );
    assert_eq!(
        new().handle_server_first(b"r=abc,s=AAAA,i=1"),
        Err(ScramError::NonceMismatch)
    );
    assert_eq!(
        new().handle_server_first(b"r=abcd,s=AAAA,i=0"),
        Err(ScramError::BadIterations)
    );
    assert_eq!(
        new().handle_server_first(b"r=abcd,s=AAAA,i=100000001"),
        Err(ScramError::BadIterations)
    );
    assert!(new().handle_server_first(b"m=x,r=abcd,s=AAAA,i=1").is_err());
    assert!(new().handle_server_first(b"r=abcd,s=!!,i=1").is_err());
    assert_eq!(
        new().handle_server_final(b"v=AAAA"),
        Err(ScramError::OutOfOrder)
    );
    let mut c = new();
    c.handle_server_first(b"r=abcd,s=AAAA,i=1").unwrap();
    assert_eq!(
        c.handle_server_first(b"r=abcd,s=AAAA,i=1"),
        Err(ScramError::OutOfOrder)
    );
}

#[test]
fn nonces_are_random_base64() {
    let a = random_nonce();
    assert_eq!(a.len(), 24);
    assert_ne!(a, random_nonce());
    assert!(valid_nonce(&a));
}

#[test]
fn user_names_are_escaped() {
    let c = ScramClient::new(ScramCredential::Password(String::new()), "n".into())
        .with_username("a=b,c");
    assert_eq!(c.client_first(), b"n,,n=a=3Db=2Cc,r=n");
}
