//! The bank client's tests: the contract's answers classified, lookups read, and no
//! text of the bank's kept.

use super::answer::*;
use super::*;
use http::header::HeaderValue;
use proptest::prelude::*;

fn outcome(status: u16, body: &str) -> Result<PayoutOutcome, String> {
    match classify(
        StatusCode::from_u16(status).unwrap(),
        body.as_bytes(),
        None,
        None,
    ) {
        Answer::Done(o) => Ok(o),
        Answer::Retry { error, .. } => Err(error),
    }
}

#[test]
fn classification_follows_the_bank_contract() {
    assert_eq!(
        outcome(201, r#"{"paymentId":"p-1"}"#),
        Ok(PayoutOutcome::Paid {
            payment_id: "p-1".into()
        })
    );
    assert!(
        outcome(200, "{}").is_err(),
        "a 2xx without an id is asked again"
    );
    for transient in [409, 429, 408, 500, 502, 503, 599] {
        assert!(outcome(transient, "").is_err(), "{transient} is transient");
    }
    assert!(matches!(
        outcome(422, ""),
        Ok(PayoutOutcome::KeyMismatch { .. })
    ));
    for rejected in [400, 402] {
        assert!(
            matches!(outcome(rejected, ""), Ok(PayoutOutcome::Rejected { .. })),
            "{rejected}"
        );
    }
}

#[test]
fn the_services_own_faults_never_reject_a_payment() {
    for status in [
        301, 302, 307, 401, 403, 404, 405, 407, 410, 413, 415, 418, 451,
    ] {
        assert!(
            matches!(
                outcome(status, "no"),
                Ok(PayoutOutcome::ServiceFault { status: s, .. }) if s == status
            ),
            "{status} must be a service fault, got {:?}",
            outcome(status, "no")
        );
    }
}

#[test]
fn retry_after_takes_seconds_or_an_http_date_and_is_capped() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert_eq!(retry_after("3", now), Some(Duration::from_secs(3)));
    assert_eq!(
        retry_after("18446744073709551615", now),
        Some(MAX_RETRY_AFTER)
    );
    assert_eq!(
        retry_after("99999999999999999999999", now),
        Some(MAX_RETRY_AFTER)
    );
    let in_ten = httpdate::fmt_http_date(now + Duration::from_secs(10));
    assert_eq!(retry_after(&in_ten, now), Some(Duration::from_secs(10)));
    let past = httpdate::fmt_http_date(now - Duration::from_secs(10));
    assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
    assert_eq!(retry_after("soon", now), None);
    assert_eq!(retry_after("-1", now), None);
}

#[test]
fn the_window_ends_before_the_key_window_by_a_margin() {
    let created = OffsetDateTime::now_utc();
    let day = Duration::from_secs(86_400);
    let w = SendWindow::new(Duration::from_secs(60), created, day);
    assert_eq!(w.last_send, created + day - KEY_WINDOW_MARGIN);
    let short = SendWindow::new(Duration::from_secs(60), created, Duration::from_secs(10));
    assert_eq!(short.last_send, created + Duration::from_secs(9));
}

const KEY: &str = "tenant-a:claim-payment-1";

fn entry(reference: Option<&str>, status: &str, amount: &str) -> serde_json::Value {
    let mut e = serde_json::json!({"paymentId": "p1", "status": status, "amount": amount, "currency": "EUR"});
    if let Some(r) = reference {
        e["reference"] = r.into();
    }
    e
}

fn lookup_of(entries: &[serde_json::Value]) -> Lookup {
    let body = serde_json::to_vec(entries).unwrap();
    read_lookup(
        StatusCode::OK,
        &body,
        &IdempotencyKey::from_stored(KEY.into()),
        Some("s3cr3t"),
    )
}

#[test]
fn only_a_200_with_a_list_is_a_lookup_answer() {
    let key = IdempotencyKey::from_stored(KEY.into());
    let ok = |body: &str| read_lookup(StatusCode::OK, body.as_bytes(), &key, None);
    assert_eq!(ok("[]"), Lookup::Holds(vec![]));
    match lookup_of(&[entry(Some(KEY), "paid", "10.0")]) {
        Lookup::Holds(p) => assert_eq!(
            p,
            vec![BankPayment {
                payment_id: "p1".into(),
                status: BankStatus::Paid,
                amount: Decimal::new(10, 0),
                currency: "EUR".into(),
            }]
        ),
        other => panic!("{other:?}"),
    }
    for unknown in [
        read_lookup(StatusCode::SERVICE_UNAVAILABLE, b"[]", &key, None),
        read_lookup(StatusCode::TOO_MANY_REQUESTS, b"[]", &key, None),
        read_lookup(StatusCode::NOT_FOUND, b"[]", &key, None),
        ok("{}"),
        ok("not json"),
        ok(r#"[{"paymentId":"p1"}]"#),
    ] {
        assert!(matches!(unknown, Lookup::Unknown { .. }), "{unknown:?}");
    }
}

/// The bank may normalise the reference's case: still ours. An entry without a
/// reference, or under another one, is neither ours nor "nothing held".
#[test]
fn lookup_references_compare_ignoring_case_and_must_be_there() {
    let upper = KEY.to_uppercase();
    assert!(matches!(
        lookup_of(&[entry(Some(&upper), "paid", "10.00")]),
        Lookup::Holds(p) if p.len() == 1
    ));
    for (entries, why) in [
        (vec![entry(None, "paid", "10.00")], "no reference"),
        (
            vec![entry(Some("tenant-b:claim-payment-9"), "paid", "10.00")],
            "another reference",
        ),
        (
            vec![
                entry(Some(KEY), "paid", "10.00"),
                entry(Some("other"), "paid", "10.00"),
            ],
            "another reference",
        ),
        (vec![entry(Some(KEY), "paid", "1e3")], "amount"),
        (vec![entry(Some(KEY), "paid", "-")], "amount"),
    ] {
        match lookup_of(&entries) {
            Lookup::Unknown { reason } => assert!(reason.contains(why), "{reason}"),
            other => panic!("{entries:?}: {other:?}"),
        }
    }
    let mut lower_currency = entry(Some(KEY), "paid", "10.00");
    lower_currency["currency"] = "eur".into();
    assert!(matches!(
        lookup_of(&[lower_currency]),
        Lookup::Unknown { .. }
    ));
}

/// A bank (or proxy) that reflects our request in its answers: nothing of its text
/// is kept, and a token carrying the credential is refused.
#[test]
fn no_text_of_the_bank_is_kept_and_the_credential_never_is() {
    let secret = "s3cr3t-bank-key";
    let echo = format!("Authorization: Bearer {secret}\nIdempotency-Key: k");
    let key = IdempotencyKey::from_stored(KEY.into());
    for status in [400u16, 402, 404, 409, 422, 429, 500, 503] {
        let status = StatusCode::from_u16(status).unwrap();
        let text = match classify(status, echo.as_bytes(), None, Some(secret)) {
            Answer::Retry { error, .. } => error,
            Answer::Done(outcome) => format!("{outcome:?}"),
        };
        assert!(!text.contains(secret) && !text.contains("Bearer"), "{text}");
        let Lookup::Unknown { reason } = read_lookup(status, echo.as_bytes(), &key, Some(secret))
        else {
            panic!("a {status} lookup is not an answer")
        };
        assert!(!reason.contains(secret), "{reason}");
    }
    // The contract's error code is kept; one that carries the credential is not.
    let coded = classify(
        StatusCode::PAYMENT_REQUIRED,
        br#"{"code":"insufficient_funds","error":"Bearer x"}"#,
        None,
        Some(secret),
    );
    assert_eq!(
        coded,
        Answer::Done(PayoutOutcome::Rejected {
            status: 402,
            reason: "bank answered 402 Payment Required (code insufficient_funds)".into()
        })
    );
    let leaked = format!(r#"{{"code":"{secret}"}}"#);
    assert!(!format!(
        "{:?}",
        classify(
            StatusCode::BAD_REQUEST,
            leaked.as_bytes(),
            None,
            Some(secret)
        )
    )
    .contains(secret));
    // A "payment id" that reflects the credential is no payment id.
    let paid = format!(r#"{{"paymentId":"Bearer-{secret}"}}"#);
    assert!(matches!(
        classify(StatusCode::CREATED, paid.as_bytes(), None, Some(secret)),
        Answer::Retry { .. }
    ));
    let mut e = entry(Some(KEY), "paid", "10.00");
    e["paymentId"] = secret.into();
    assert!(matches!(lookup_of(&[e]), Lookup::Unknown { .. }));
    // A JSON error quotes the value it choked on; the reason must not.
    let bad = format!(r#"[{{"paymentId":1,"status":"{secret}"}}]"#);
    match read_lookup(StatusCode::OK, bad.as_bytes(), &key, Some(secret)) {
        Lookup::Unknown { reason } => assert!(!reason.contains(secret), "{reason}"),
        other => panic!("{other:?}"),
    }
}

proptest! {
    /// No answer of the bank may panic the handler: arbitrary statuses, headers and
    /// bodies are read into an outcome or a retry, and a retry's wait is bounded.
    #[test]
    fn any_bank_answer_is_read_without_panicking(
        status in 100u16..=999,
        header_values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
        header_names in proptest::collection::vec("[a-zA-Z-]{1,20}", 0..4),
        retry in prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            "[0-9]{0,40}",
            ".{0,40}",
            any::<u32>().prop_map(|s| httpdate::fmt_http_date(
                SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(s) * 2))),
        ],
        body in proptest::collection::vec(any::<u8>(), 0..300),
        now_secs in any::<u32>(),
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in header_names.iter().zip(&header_values) {
            if let (Ok(n), Ok(v)) = (
                http::header::HeaderName::try_from(name.as_str()),
                HeaderValue::from_bytes(value),
            ) {
                headers.append(n, v);
            }
        }
        if let Ok(v) = HeaderValue::from_str(&retry) {
            headers.insert(RETRY_AFTER, v);
        }
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(now_secs));
        let status = StatusCode::from_u16(status).unwrap();
        match read_answer(status, &headers, &body, now, None) {
            Answer::Retry { after, .. } => {
                prop_assert!(after.is_none_or(|a| a <= MAX_RETRY_AFTER));
                // The wait is added to a clock reading: it must never overflow.
                let wait = after.unwrap_or_default();
                prop_assert!(Instant::now().checked_add(wait).is_some());
            }
            Answer::Done(PayoutOutcome::Paid { payment_id }) => {
                prop_assert!(status.is_success() && !payment_id.trim().is_empty());
            }
            Answer::Done(_) => prop_assert!(!status.is_success()),
        }
    }
}

/// A bank that remembers an Idempotency-Key for `window` from the key's first request,
/// pays each request it does not remember, and dates every answer by its own clock.
struct ForgetfulBank {
    /// How far the world's time was moved on (the bank's outage), in seconds.
    skipped: Arc<std::sync::atomic::AtomicU64>,
    window: Duration,
    first_seen: std::sync::Mutex<std::collections::BTreeMap<String, OffsetDateTime>>,
    payouts: std::sync::atomic::AtomicU32,
}

/// Where the bank's (true) clock and the instances' start.
fn epoch() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_767_225_600).unwrap()
}

/// The true time: the epoch, moved on by `skipped` seconds.
fn true_wall(skipped: &std::sync::atomic::AtomicU64) -> OffsetDateTime {
    epoch() + Duration::from_secs(skipped.load(std::sync::atomic::Ordering::SeqCst))
}

#[async_trait::async_trait]
impl BankTransport for ForgetfulBank {
    async fn send(&self, call: BankCall<'_>) -> Result<BankAnswer, TransportFailure> {
        let now = true_wall(&self.skipped);
        let date = httpdate::fmt_http_date(now.into());
        let headers =
            HeaderMap::from_iter([(http::header::DATE, HeaderValue::from_str(&date).unwrap())]);
        let body = match call {
            BankCall::Payout { key, .. } => {
                let mut seen = self.first_seen.lock().unwrap();
                match seen.get(key.as_str()) {
                    Some(at) if now < *at + self.window => {}
                    _ => {
                        seen.insert(key.as_str().to_owned(), now);
                        self.payouts
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                r#"{"paymentId":"p-1"}"#
            }
            BankCall::Lookup { .. } => "[]",
        };
        Ok(BankAnswer {
            status: if body == "[]" {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            },
            headers,
            body: Ok(body.as_bytes().to_vec()),
        })
    }
}

/// An instance's clock `behind` the bank's.
struct BehindClock {
    skipped: Arc<std::sync::atomic::AtomicU64>,
    behind: Duration,
}

impl crate::ambient::WallClock for BehindClock {
    fn now(&self) -> OffsetDateTime {
        true_wall(&self.skipped) - self.behind
    }
}

struct NoEntropy;

impl crate::ambient::Entropy for NoEntropy {
    fn fill(&self, bytes: &mut [u8]) {
        bytes.fill(7);
    }
}

/// A payout made, its answer lost, the bank out of reach past its key window: an
/// instance whose clock is ten minutes behind still reads the key window as open (its
/// margin is five minutes) and would send the request again, which the bank, having
/// forgotten the key, pays a second time. The clock is read against the bank's `Date`
/// first, and the request never leaves.
#[tokio::test]
async fn a_clock_too_far_behind_sends_nothing_after_the_bank_forgot_the_key() {
    let day = Duration::from_secs(86_400);
    let skipped = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bank = Arc::new(ForgetfulBank {
        skipped: skipped.clone(),
        window: day,
        first_seen: Default::default(),
        payouts: Default::default(),
    });
    let settings = BankSettings {
        url: "https://bank.invalid".parse().unwrap(),
        api_key: None,
        timeout: Duration::from_secs(5),
        key_window: day,
    };
    let instance = |behind: Duration| {
        let clock = BehindClock {
            skipped: skipped.clone(),
            behind,
        };
        let ambient = Ambient::new(
            Arc::new(clock),
            Arc::new(NoEntropy),
            crate::ambient::Boot::numbered(1),
        );
        BankClient::with_transport(&settings, bank.clone(), ambient)
    };
    let key = crate::domain::IdempotencyKey::from_stored("tenant-a:claim-1".into());
    let created_at = epoch();
    let budget = Duration::from_secs(60);
    let first = instance(Duration::ZERO)
        .pay(&key, "{}", SendWindow::new(budget, created_at, day))
        .await;
    assert!(matches!(first, PayoutOutcome::Paid { .. }), "{first:?}");

    skipped.store(
        (day + Duration::from_secs(60)).as_secs(),
        std::sync::atomic::Ordering::SeqCst,
    );
    let behind = instance(Duration::from_secs(600));
    let again = behind
        .pay(&key, "{}", SendWindow::new(budget, created_at, day))
        .await;
    assert!(
        matches!(&again, PayoutOutcome::ClockUntrusted { attempts: 0, reason } if reason.contains("behind")),
        "{again:?}"
    );
    assert_eq!(bank.payouts.load(std::sync::atomic::Ordering::SeqCst), 1);
}
