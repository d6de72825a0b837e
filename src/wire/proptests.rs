//! Property tests: arbitrary input never makes a decoder panic, errors never consume input,
//! encoders round-trip through the decoders, and the frame scanner and the borrowed views read
//! what the decoders read.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;

use super::codec::put_message;
use super::*;

fn any_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// A name or text, usually ending at its NUL.
fn cstr() -> impl Strategy<Value = Vec<u8>> {
    ("[a-z]{0,4}", prop::bool::weighted(0.9)).prop_map(|(s, nul)| {
        let mut v = s.into_bytes();
        if nul {
            v.push(0);
        }
        v
    })
}

/// A few bytes that may follow a well-formed body.
fn junk() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![3 => Just(Vec::new()), 1 => any_bytes(3)]
}

/// One of the client messages the views read (an index into [`VIEWED`]) and a body for it:
/// arbitrary bytes, or one shaped like that message and often well formed.
fn viewed_message() -> impl Strategy<Value = (usize, Vec<u8>)> {
    (0..VIEWED.len()).prop_flat_map(|which| {
        let shaped = match VIEWED[which] {
            frontend::tag::QUERY => ("[a-z\\x00]{0,6}", prop::bool::weighted(0.8), junk())
                .prop_map(|(text, nul, junk)| {
                    let mut v = text.into_bytes();
                    v.extend(nul.then_some(0));
                    v.extend(junk);
                    v
                })
                .boxed(),
            frontend::tag::PARSE => (
                cstr(),
                cstr(),
                -1i16..3,
                prop::collection::vec(any::<u32>(), 0..3),
                junk(),
            )
                .prop_map(|(name, query, count, oids, junk)| {
                    let mut v = [name, query].concat();
                    v.extend(count.to_be_bytes());
                    oids.iter().for_each(|oid| v.extend(oid.to_be_bytes()));
                    v.extend(junk);
                    v
                })
                .boxed(),
            frontend::tag::BIND => (cstr(), cstr(), any_bytes(8))
                .prop_map(|(portal, statement, rest)| [portal, statement, rest].concat())
                .boxed(),
            _ => (
                prop_oneof![
                    Just(frontend::target::STATEMENT),
                    Just(frontend::target::PORTAL),
                    any::<u8>()
                ],
                cstr(),
                junk(),
            )
                .prop_map(|(kind, name, junk)| [vec![kind], name, junk].concat())
                .boxed(),
        };
        (Just(which), prop_oneof![1 => any_bytes(48), 3 => shaped])
    })
}

/// The client messages the views read.
const VIEWED: [u8; 5] = [
    frontend::tag::QUERY,
    frontend::tag::PARSE,
    frontend::tag::BIND,
    frontend::tag::CLOSE,
    frontend::tag::DESCRIBE,
];

/// Arbitrary bytes, or a run of well-framed messages with arbitrary tags and bodies followed
/// by arbitrary bytes (random bytes alone seldom hold a plausible length word).
fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
    let framed = (
        prop::collection::vec((any::<u8>(), any_bytes(24)), 0..6),
        any_bytes(12),
    )
        .prop_map(|(messages, tail)| {
            let mut b = BytesMut::new();
            for (tag, body) in messages {
                put_message(&mut b, tag, |b| b.put_slice(&body));
            }
            b.put_slice(&tail);
            b.to_vec()
        });
    prop_oneof![any_bytes(300), framed]
}

fn frame(tag: u8, body: &[u8]) -> Frame {
    let mut b = BytesMut::new();
    put_message(&mut b, tag, |b| b.put_slice(body));
    Frame::from_raw(b.freeze()).expect("valid frame")
}

/// Drains frames from `buf`; checks that errors and incomplete reads leave `buf` untouched
/// and that each frame is exactly what was consumed.
fn drain_frames(buf: &mut BytesMut, max: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    loop {
        let before = buf.clone();
        match decode_frame(buf, max) {
            Ok(Some(f)) => {
                assert_eq!(f.raw()[..], before[..f.len()]);
                assert!(f.len() >= HEADER_LEN && f.len() - 1 <= max);
                out.push(f);
            }
            Ok(None) | Err(_) => {
                assert_eq!(*buf, before);
                return out;
            }
        }
    }
}

fn sample_stream() -> BytesMut {
    let mut b = BytesMut::new();
    encode_query(&mut b, "select 1");
    encode_parse(&mut b, b"s", b"select $1", &[23]);
    encode_describe(&mut b, b'S', b"s");
    encode_sync(&mut b);
    encode_error(&mut b, &ErrorResponse::error(sqlstate::SYNTAX_ERROR, "x"));
    encode_data_row(&mut b, &[Some(b"1"), None]);
    encode_ready_for_query(&mut b, TxStatus::Idle);
    b
}

proptest! {
    #[test]
    fn decode_frame_never_panics(data in any_bytes(300), max in 0usize..400) {
        let mut buf = BytesMut::from(&data[..]);
        for f in drain_frames(&mut buf, max) {
            let _ = decode_frontend(&f);
            let _ = decode_backend(&f);
        }
    }

    #[test]
    fn split_streams_decode_identically(cuts in prop::collection::vec(0usize..200, 0..8)) {
        let whole = sample_stream();
        let expected = drain_frames(&mut whole.clone(), DEFAULT_MAX_MESSAGE_LEN);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(whole.len())).collect();
        cuts.push(whole.len());
        cuts.sort_unstable();
        let (mut buf, mut got, mut from) = (BytesMut::new(), Vec::new(), 0);
        for to in cuts {
            buf.put_slice(&whole[from..to]);
            from = to;
            got.extend(drain_frames(&mut buf, DEFAULT_MAX_MESSAGE_LEN));
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn scan_frame_agrees_with_decode_frame(
        data in stream_bytes(),
        max in 0usize..64,
        skip in 0usize..8,
    ) {
        // The scanner walks the buffer in place, from any offset; decode_frame splits
        // messages off its front. Both must see the same messages and stop the same way.
        let skip = skip.min(data.len());
        let mut buf = BytesMut::from(&data[skip..]);
        let mut offset = skip;
        loop {
            let scanned = scan_frame(&data, offset, max);
            let decoded = decode_frame(&mut buf, max);
            match (scanned, decoded) {
                (Ok(Some(span)), Ok(Some(frame))) => {
                    prop_assert_eq!(span.start, offset);
                    prop_assert_eq!(&data[span.start..span.end], &frame.raw()[..]);
                    prop_assert_eq!(span.tag, frame.tag());
                    prop_assert_eq!(&data[span.body()], &frame.body()[..]);
                    prop_assert_eq!(span.total_len(), frame.len());
                    offset = span.end;
                }
                (Ok(None), Ok(None)) => {
                    let left = data.len() - offset;
                    match FrameHeader::at(&data, offset) {
                        None => prop_assert!(left < HEADER_LEN),
                        Some(head) => prop_assert!(head.len as usize + 1 > left),
                    }
                    break;
                }
                (Err(bad), Err(e)) => {
                    prop_assert_eq!(WireError::from(bad), e);
                    prop_assert_eq!(Some(bad.tag), data.get(offset).copied());
                    break;
                }
                (s, d) => prop_assert!(false, "scan {:?}, decode {:?}", s, d),
            }
        }
        // Past the end, or at any offset, the scanner answers without panicking.
        let _ = scan_frame(&data, data.len() + skip, max);
        let _ = scan_frame(&data, usize::MAX, max);
    }

    #[test]
    fn views_never_panic_and_agree_with_decode_frontend((which, body) in viewed_message()) {
        use frontend::tag;
        // Every view reads any body without panicking.
        let query = QueryView::new(&body);
        let parse = ParseView::new(&body);
        let types = parse.as_ref().map(|p| p.param_types());
        let bind = BindView::new(&body);
        let close = CloseView::new(&body);
        if let Ok(Ok(types)) = types {
            prop_assert_eq!(types.iter().len(), types.len());
        }
        if let Ok(b) = bind {
            if let Ok(params) = b.params() {
                prop_assert!(b.rest.starts_with(params));
            }
            let mut out = BytesMut::new();
            b.encode_renamed(&mut out, b"x");
            let renamed = decode_frame(&mut out, usize::MAX).unwrap().unwrap();
            let body = renamed.body();
            let again = BindView::new(&body).unwrap();
            prop_assert_eq!((again.portal, again.statement, again.rest), (b.portal, &b"x"[..], b.rest));
        }
        // Where the typed decoder accepts a body, the view reads the same from it; where the
        // view refuses it, so does the decoder.
        let tag = VIEWED[which];
        let decoded = decode_frontend(&frame(tag, &body));
        match decoded {
            Ok(Frontend::Query { sql }) => prop_assert_eq!(&sql[..], query.text),
            Ok(Frontend::Parse { name, query, param_types }) => {
                let p = parse.as_ref().unwrap();
                prop_assert_eq!((&name[..], &query[..]), (p.name, p.query));
                let types: Vec<u32> = p.param_types().unwrap().iter().collect();
                prop_assert_eq!(param_types, types);
            }
            Ok(Frontend::Bind { portal, statement }) => {
                let b = bind.unwrap();
                prop_assert_eq!((&portal[..], &statement[..]), (b.portal, b.statement));
            }
            Ok(Frontend::Close { kind, name } | Frontend::Describe { kind, name }) => {
                let c = close.unwrap();
                prop_assert_eq!((kind, &name[..]), (c.kind, c.name));
            }
            Ok(other) => prop_assert!(false, "{:?} from {}", other, tag as char),
            Err(_) => match tag {
                tag::QUERY => prop_assert!(body.last() != Some(&0) || query.text.contains(&0)),
                tag::PARSE => prop_assert!(!matches!(types, Ok(Ok(_)))),
                tag::BIND => prop_assert!(bind.is_err()),
                _ => prop_assert!(close.is_err() || body.len() != close.unwrap().name.len() + 2),
            },
        }
    }

    #[test]
    fn binds_roundtrip_through_the_view(
        portal in any_bytes(6),
        statement in any_bytes(6),
        values in prop::collection::vec(any_bytes(6), 0..4),
    ) {
        let strip = |v: &[u8]| v.split(|&b| b == 0).next().unwrap_or_default().to_vec();
        let values: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
        let mut b = BytesMut::new();
        encode_bind_text(&mut b, &portal, &statement, &values);
        let f = decode_frame(&mut b, 1 << 20).unwrap().unwrap();
        let body = f.body();
        let view = BindView::new(&body).unwrap();
        prop_assert_eq!(view.portal, &strip(&portal)[..]);
        prop_assert_eq!(view.statement, &strip(&statement)[..]);
        // The parameters end where the (empty) list of result formats begins.
        let params = view.params().unwrap();
        prop_assert_eq!(&view.rest[params.len()..], &[0, 0][..]);
        let mut again = BytesMut::new();
        encode_bind(&mut again, view.portal, view.statement, params, &[]);
        prop_assert_eq!(&again[..], &f.raw()[..]);
    }

    #[test]
    fn decode_startup_never_panics(data in any_bytes(300), max in 0usize..400) {
        let mut buf = BytesMut::from(&data[..]);
        let before = buf.clone();
        match decode_startup(&mut buf, max) {
            Ok(Some(_)) => prop_assert!(buf.len() < before.len()),
            Ok(None) | Err(_) => prop_assert_eq!(buf, before),
        }
    }

    #[test]
    fn startup_packets_roundtrip(
        params in prop::collection::vec(("[a-z_]{1,8}", "[^\u{0}]{0,8}"), 0..5),
        minor in any::<u16>(),
    ) {
        let mut params: Vec<(String, String)> = params;
        params.push(("user".into(), "u".into()));
        let packet = StartupPacket::Startup { major: 3, minor, params };
        let mut buf = BytesMut::new();
        encode_startup_packet(&mut buf, &packet);
        prop_assert_eq!(decode_startup(&mut buf, 10_000).unwrap(), Some(packet));
    }

    #[test]
    fn typed_decoders_never_panic(tag in any::<u8>(), body in any_bytes(64)) {
        let f = frame(tag, &body);
        let _ = decode_frontend(&f);
        let _ = decode_backend(&f);
        let _ = parse_sasl_initial(&body);
        let _ = parse_password(&body);
        let _ = ErrorFields::parse(&body);
    }

    #[test]
    fn queries_roundtrip(sql in "[^\u{0}]{0,40}") {
        let mut b = BytesMut::new();
        encode_query(&mut b, &sql);
        let f = decode_frame(&mut b, 1 << 20).unwrap().unwrap();
        prop_assert_eq!(
            decode_frontend(&f).unwrap(),
            Frontend::Query { sql: Bytes::from(sql.into_bytes()) }
        );
    }

    #[test]
    fn parse_roundtrips(name in any_bytes(8), query in any_bytes(16), types in prop::collection::vec(any::<u32>(), 0..6)) {
        let strip = |v: &[u8]| Bytes::copy_from_slice(v.split(|&b| b == 0).next().unwrap_or_default());
        let mut b = BytesMut::new();
        encode_parse(&mut b, &name, &query, &types);
        let f = decode_frame(&mut b, 1 << 20).unwrap().unwrap();
        let body = f.body();
        let view = ParseView::new(&body).unwrap();
        prop_assert_eq!((view.name, view.query), (&strip(&name)[..], &strip(&query)[..]));
        let viewed: Vec<u32> = view.param_types().unwrap().iter().collect();
        prop_assert_eq!(&viewed, &types);
        let mut raw = BytesMut::new();
        encode_parse_raw(&mut raw, view.name, view.query, view.raw_types());
        prop_assert_eq!(&raw[..], &f.raw()[..]);
        prop_assert_eq!(
            decode_frontend(&f).unwrap(),
            Frontend::Parse { name: strip(&name), query: strip(&query), param_types: types }
        );
    }

    #[test]
    fn scram_server_never_panics(first in any_bytes(80), last in any_bytes(120)) {
        let secret = ScramSecret::from_password("pw", b"salt", 1);
        let mut server = ScramServer::new(secret.clone(), "srv".into());
        let _ = server.first(&first);
        let _ = server.finish(&last);
        let mut server = ScramServer::new(secret, "srv".into());
        server.first(b"n,,n=,r=abc").unwrap();
        let mut forged = b"c=biws,r=abcsrv,p=".to_vec();
        forged.extend_from_slice(&last);
        prop_assert!(server.finish(&forged).is_err());
    }

    #[test]
    fn scram_client_never_panics(first in any_bytes(80), last in any_bytes(80)) {
        let cred = ScramCredential::Keys { client_key: [1; 32], server_key: [2; 32] };
        let mut client = ScramClient::new(cred.clone(), "abc".into());
        let _ = client.handle_server_first(&first);
        let _ = client.handle_server_final(&last);
        let mut client = ScramClient::new(cred, "abc".into());
        client.handle_server_first(b"r=abcd,s=AAAA,i=1").unwrap();
        prop_assert!(client.handle_server_final(&last).is_err());
    }
}
