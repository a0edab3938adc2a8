//! The dashboard's endpoints and page: real Postgres, the service on port 0, a manual clock.
//! Tenant A sees its own apps, bids and leases in full and tenant B's only anonymised.

mod support;

use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::{json, Value};
use support::{active, config, fresh_database, serve, start_clock, Service, ADMIN};

/// Two tenants: vision's explicit app wins the first round, speech's agent app the second.
struct Market {
    service: Service,
    vision: String,
    speech: String,
    tuner: i64,
    speaker: i64,
}

async fn two_tenant_market() -> Market {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let tuner = service
        .register(&vision, "tuner", "explicit", 2, 1_000)
        .await;
    let offer = service.wait_for(&vision, tuner, "offer").await;
    let round = offer["round"].as_i64().expect("round");
    assert!(
        service
            .running
            .store
            .decided_rounds_after(agora_server::ids::RoundId(0), 10)
            .await
            .expect("rounds")
            .is_empty(),
        "the rounds stream holds back a round still open"
    );
    let gpus: Vec<Value> = offer["gpus"].as_array().expect("gpus")[..2]
        .iter()
        .map(|gpu| gpu["id"].clone())
        .collect();
    let bid = json!({ "app": tuner, "rho_old": offer["rho"],
                      "bids": [{ "gpus": [gpus[0]], "rho": 2.5 }, { "gpus": gpus, "rho": 1.5 }] });
    service.bid(&vision, round, bid).await;
    service
        .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
        .await;
    let speaker = service
        .register(&speech, "speaker", "agent", 2, 1_000)
        .await;
    service
        .wait_for_leases(&speech, speaker, |leases| active(leases).len() == 1)
        .await;
    Market {
        service,
        vision,
        speech,
        tuner,
        speaker,
    }
}

#[actix_web::test]
async fn an_apps_rho_history_and_rounds_are_shown_to_its_tenant_only() {
    let market = two_tenant_market().await;
    let service = &market.service;

    let (status, me) = service.call("GET", "/v1/me", &market.vision, None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        (me["role"].as_str(), me["tenant"].as_str()),
        (Some("tenant"), Some("vision"))
    );
    let ids: Vec<i64> = me["apps"]
        .as_array()
        .expect("apps")
        .iter()
        .filter_map(|app| app["id"].as_i64())
        .collect();
    assert_eq!(ids, vec![market.tuner]);
    let (_, me) = service.call("GET", "/v1/me", ADMIN, None).await;
    assert_eq!(me["role"], "admin");
    assert_eq!(me["apps"].as_array().expect("apps").len(), 2, "{me}");

    let history_path = format!("/v1/apps/{}/rho-history", market.tuner);
    let (status, history) = service
        .call("GET", &history_path, &market.vision, None)
        .await;
    assert_eq!(status, 200, "{history}");
    let rounds: Vec<i64> = history
        .as_array()
        .expect("points")
        .iter()
        .filter_map(|point| point["round_id"].as_i64())
        .collect();
    assert!(
        rounds.len() >= 2 && rounds.windows(2).all(|pair| pair[0] < pair[1]),
        "oldest first: {history}"
    );
    assert!(
        history[0]["rho"].is_null(),
        "it held no GPU when it arrived: {history}"
    );
    assert!(
        history[1]["rho"].as_f64().is_some_and(|rho| rho > 0.0),
        "{history}"
    );

    let (status, rounds) = service
        .call(
            "GET",
            &format!("/v1/apps/{}/rounds", market.tuner),
            &market.vision,
            None,
        )
        .await;
    assert_eq!(status, 200, "{rounds}");
    let first = rounds
        .as_array()
        .expect("rounds")
        .last()
        .expect("the round it bid in")
        .clone();
    assert_eq!(first["bidder"], true);
    assert_eq!(first["bid"]["source"], "framework");
    assert_eq!(first["bid"]["entries"].as_array().map(Vec::len), Some(2));
    assert_eq!(first["won"], true);
    assert_eq!(first["won_gpus"].as_array().map(Vec::len), Some(2));
    let (_, full) = service
        .call(
            "GET",
            &format!("/v1/rounds/{}", first["round_id"]),
            ADMIN,
            None,
        )
        .await;
    let allocation = full["allocations"]
        .as_array()
        .expect("allocations")
        .iter()
        .find(|row| row["app_id"] == market.tuner)
        .expect("the tuner's allocation")
        .clone();
    assert_eq!(
        (&first["pf_entry"], &first["c"], &first["won_gpus"]),
        (
            &allocation["pf_entry"],
            &allocation["c"],
            &allocation["kept_gpus"]
        )
    );
    // The round in words: the only app offered GPUs, starving, it bid for up to 2 and kept
    // the 2 of its proportional-fair bundle.
    let c = allocation["c"].as_f64().expect("a bidder's c");
    assert_eq!(
        first["why"].as_str(),
        Some(
            format!(
                "Round {}: you were the worst-off app (ρ ∞) and bid for 2 GPUs; \
                 the auction gave you 2 (you keep both: c = {c:.3})",
                first["round_id"]
            )
            .as_str()
        ),
        "{first}"
    );

    // Two later rounds in which the speaker was the only app offered GPUs: in one the tuner
    // wanted two more, in the other it held all it could use. The first is listed, in words.
    let pool = service.running.store.pool();
    for (round, tuner_unmet) in [(100_001, 2), (100_002, 0)] {
        sqlx::query(
            "INSERT INTO rounds SELECT (jsonb_populate_record(NULL::rounds,
                 to_jsonb(r) || jsonb_build_object('id', $1::bigint))).*
             FROM rounds r WHERE r.id = (SELECT max(id) FROM rounds WHERE id < 100000)",
        )
        .bind(round)
        .execute(pool)
        .await
        .expect("a round");
        sqlx::query(
            "INSERT INTO round_standings (round_id, position, app_id, rho, unmet_demand, bidder)
             VALUES ($1, 0, $2, NULL, 2, true), ($1, 1, $3, 1.25, $4, false)",
        )
        .bind(round)
        .bind(market.speaker)
        .bind(market.tuner)
        .bind(tuner_unmet)
        .execute(pool)
        .await
        .expect("standings");
    }
    let (_, rounds) = service
        .call(
            "GET",
            &format!("/v1/apps/{}/rounds?after=2", market.tuner),
            &market.vision,
            None,
        )
        .await;
    let listed: Vec<(i64, &str)> = rounds
        .as_array()
        .expect("rounds")
        .iter()
        .map(|round| {
            (
                round["round_id"].as_i64().unwrap_or(0),
                round["why"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![(
            100_001,
            "Round 100001: not offered: 1 app was worse off (ρ 1.250) and only the worst-off \
             app was offered GPUs"
        )],
        "{rounds}"
    );

    for path in [
        history_path.clone(),
        format!("/v1/apps/{}/rounds", market.tuner),
    ] {
        let (status, body) = service.call("GET", &path, &market.speech, None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("not_found")),
            "another tenant's app is answered as a missing one: {path}"
        );
    }
    let (status, body) = service
        .call("GET", "/v1/apps/999999/rho-history", ADMIN, None)
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, _) = service
        .call("GET", &history_path, "not-a-token", None)
        .await;
    assert_eq!(status, 401);
    service.running.stop().await;
}

#[actix_web::test]
async fn fairness_and_the_lease_timeline_anonymise_other_tenants() {
    let market = two_tenant_market().await;
    let service = &market.service;

    let (status, summary) = service
        .call("GET", "/v1/fairness", &market.vision, None)
        .await;
    assert_eq!(status, 200, "{summary}");
    let apps = summary["apps"].as_array().expect("apps");
    assert_eq!(
        apps.len(),
        2,
        "both apps stood in the latest round: {summary}"
    );
    let mine: Vec<&Value> = apps
        .iter()
        .filter(|app| app["app_id"] == market.tuner)
        .collect();
    let others: Vec<&Value> = apps.iter().filter(|app| app["app_id"].is_null()).collect();
    assert_eq!((mine.len(), others.len()), (1, 1), "{summary}");
    assert!(others[0]["name"].is_null(), "{summary}");
    assert_eq!(mine[0]["name"], "tuner");
    // The latest round was the speaker's first: it held nothing then, the tuner two GPUs.
    assert_eq!(summary["starving_apps"], 1);
    assert_eq!(summary["max_rho"], mine[0]["rho"]);
    assert_eq!(summary["jains_index"].as_f64(), Some(1.0), "one finite rho");
    assert_eq!(
        summary["gpus"],
        json!({ "total": 4, "healthy": 4, "held": 4 })
    );
    assert_eq!(summary["utilisation"].as_f64(), Some(1.0));
    let (_, admin_summary) = service.call("GET", "/v1/fairness", ADMIN, None).await;
    assert!(admin_summary["apps"]
        .as_array()
        .expect("apps")
        .iter()
        .all(|app| app["app_id"].is_i64()));

    let window = "/v1/leases?from=2027-01-15T00:00:00Z&to=2027-01-15T12:00:00Z";
    let (status, leases) = service.call("GET", window, &market.vision, None).await;
    assert_eq!(status, 200, "{leases}");
    let leases = leases.as_array().expect("leases");
    assert_eq!(leases.len(), 2, "{leases:?}");
    for lease in leases {
        assert_eq!(lease["gpus"].as_array().map(Vec::len), Some(2));
        assert_eq!(lease["state"], "active");
        let mine = lease["app_id"] == market.tuner;
        assert!(
            mine || (lease["app_id"].is_null() && lease["lease_id"].is_null()),
            "{lease}"
        );
    }
    let (_, leases) = service.call("GET", window, ADMIN, None).await;
    let holders: Vec<i64> = leases
        .as_array()
        .expect("leases")
        .iter()
        .filter_map(|lease| lease["app_id"].as_i64())
        .collect();
    assert_eq!(holders, vec![market.tuner, market.speaker]);
    let (_, before) = service
        .call(
            "GET",
            "/v1/leases?from=2020-01-01T00:00:00Z&to=2020-01-02T00:00:00Z",
            ADMIN,
            None,
        )
        .await;
    assert_eq!(before, json!([]), "no lease before the market began");

    for (path, code) in [
        (
            "/v1/leases?from=2027-01-15T12:00:00Z&to=2027-01-15T00:00:00Z",
            "bad_window",
        ),
        (
            "/v1/leases?from=2027-01-01T00:00:00Z&to=2027-03-01T00:00:00Z",
            "bad_window",
        ),
        (
            "/v1/leases?from=yesterday&to=2027-01-15T00:00:00Z",
            "bad_query",
        ),
        ("/v1/leases", "bad_query"),
    ] {
        let (status, body) = service.call("GET", path, ADMIN, None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some(code)),
            "{path}: {body}"
        );
    }
    service.running.stop().await;
}

/// The text of an SSE stream until it contains `until`, failing after 10 s.
async fn read_stream(service: &Service, token: &str, last_event_id: &str, until: &str) -> String {
    let mut response = service
        .client
        .get(format!("{}/v1/rounds/events", service.base))
        .bearer_auth(token)
        .insert_header(("last-event-id", last_event_id))
        .send()
        .await
        .expect("stream opens");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok()),
        Some("text/event-stream")
    );
    let mut text = String::new();
    while !text.contains(until) {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.next())
            .await
            .unwrap_or_else(|_| panic!("no {until:?} in the stream; got {text:?}"))
            .expect("the stream goes on")
            .expect("a chunk");
        text.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
    }
    text
}

#[actix_web::test]
async fn the_rounds_stream_resumes_after_last_event_id_and_follows_new_rounds() {
    let market = two_tenant_market().await;
    let service = &market.service;

    let text = read_stream(service, &market.speech, "0", "id: 2\n").await;
    let ids: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("id: "))
        .collect();
    assert_eq!(ids, vec!["1", "2"], "{text}");
    let data: Value = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .and_then(|data| serde_json::from_str(data).ok())
        .expect("JSON data");
    assert_eq!(
        (data["round_id"].as_i64(), data["status"].as_str()),
        (Some(1), Some("closed"))
    );
    assert!(text.contains("event: round\n"));

    let text = read_stream(service, &market.speech, "1", "id: 2\n").await;
    assert!(!text.contains("id: 1\n"), "resumes after round 1: {text}");

    // The leases end: the freed GPUs go to a new round, which the open stream delivers.
    let mut response = service
        .client
        .get(format!("{}/v1/rounds/events?after=2", service.base))
        .bearer_auth(&market.vision)
        .send()
        .await
        .expect("stream opens");
    service.clock.advance(Duration::from_secs(61));
    // The new round is open once the tuner, whose lease ended, is offered GPUs in it.
    let reoffered =
        |event: &Value| event["kind"] == "offer" && event["payload"]["round"].as_i64() > Some(2);
    service
        .wait_for_event(&market.vision, market.tuner, reoffered)
        .await;
    service.clock.advance(Duration::from_secs(11));
    let chunk = tokio::time::timeout(Duration::from_secs(10), response.next())
        .await
        .expect("a new round within 10 s")
        .expect("the stream goes on")
        .expect("a chunk");
    let text = String::from_utf8_lossy(&chunk).into_owned();
    assert!(text.starts_with("id: 3\nevent: round\n"), "{text}");

    let (status, _) = service
        .call("GET", "/v1/rounds/events", "not-a-token", None)
        .await;
    assert_eq!(status, 401);
    service.running.stop().await;
}

#[actix_web::test]
async fn the_page_and_every_file_it_loads_are_served_and_documented() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let fetch = |path: String| {
        let request = service.client.get(format!("{}{path}", service.base));
        async move {
            let mut response = request.send().await.expect("request sent");
            let body = response.body().limit(1 << 20).await.expect("body");
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (
                response.status().as_u16(),
                content_type,
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    };
    let (status, content_type, page) = fetch("/".to_owned()).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "text/html; charset=utf-8")
    );
    // Every file the page names, and every module those import, is embedded.
    let mut pending: Vec<String> = page
        .split('"')
        .filter(|part| part.starts_with("/static/"))
        .map(str::to_owned)
        .collect();
    assert!(
        pending.iter().any(|path| path.ends_with("main.js")),
        "{page}"
    );
    let mut served = Vec::new();
    while let Some(path) = pending.pop() {
        if served.contains(&path) {
            continue;
        }
        let (status, content_type, body) = fetch(path.clone()).await;
        assert_eq!(status, 200, "{path}");
        let expected = if path.ends_with(".css") {
            "text/css"
        } else {
            "text/javascript"
        };
        assert!(content_type.starts_with(expected), "{path}: {content_type}");
        if path.starts_with("/static/js/") {
            for import in body.split("from './").skip(1) {
                let module = import.split('\'').next().expect("module name");
                pending.push(format!("/static/js/{module}"));
            }
        }
        served.push(path);
    }
    assert!(served.len() >= 8, "{served:?}");
    let (status, content_type, _) = fetch("/static/js/nope.js".to_owned()).await;
    assert_eq!(
        (status, content_type.as_str()),
        (404, "application/problem+json")
    );

    let (_, openapi) = service.call("GET", "/openapi.json", ADMIN, None).await;
    for path in [
        "/v1/me",
        "/v1/apps/{app}/rho-history",
        "/v1/apps/{app}/rounds",
        "/v1/fairness",
        "/v1/leases",
        "/v1/rounds/events",
    ] {
        assert!(
            openapi["paths"][path]["get"].is_object(),
            "{path} is documented"
        );
    }
    service.running.stop().await;
}

#[actix_web::test]
async fn dashboard_files_go_out_gzipped_with_an_entity_tag_that_answers_304() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let on_disk = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../web/js/charts.js"
    ))
    .expect("web/js/charts.js");
    let fetch = |headers: Vec<(&'static str, String)>| {
        let mut request = service
            .client
            .get(format!("{}/static/js/charts.js", service.base));
        for header in headers {
            request = request.insert_header(header);
        }
        async move {
            let mut response = request.send().await.expect("request sent");
            let body = response.body().limit(1 << 20).await.expect("body");
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let headers = [
                "content-encoding",
                "etag",
                "cache-control",
                "vary",
                "content-type",
            ]
            .map(header);
            (response.status().as_u16(), headers, body.to_vec())
        }
    };

    let (status, [encoding, etag, cache, vary, content_type], gzipped) =
        fetch(vec![("accept-encoding", "gzip".to_owned())]).await;
    assert_eq!((status, encoding.as_str()), (200, "gzip"));
    assert!(vary.to_lowercase().contains("accept-encoding"), "{vary}");
    assert!(
        content_type.starts_with("text/javascript"),
        "{content_type}"
    );
    assert!(
        gzipped.len() * 2 < on_disk.len(),
        "{} bytes gzipped",
        gzipped.len()
    );
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(gzipped.as_slice()),
        &mut unzipped,
    )
    .expect("gzip");
    assert_eq!(unzipped, on_disk, "the file itself, unzipped");
    assert!(
        etag.starts_with("W/\"") && etag.len() > 10,
        "a weak tag (the same tag for both encodings): {etag}"
    );
    assert_eq!(cache, "no-cache", "revalidated each time, by its tag");

    let (status, [encoding, plain_etag, ..], plain) = fetch(Vec::new()).await;
    assert_eq!((status, encoding.as_str()), (200, ""));
    assert_eq!((plain, plain_etag), (on_disk.clone(), etag.clone()));

    let (status, [_, unchanged_etag, cache, ..], body) = fetch(vec![
        ("accept-encoding", "gzip".to_owned()),
        ("if-none-match", etag.clone()),
    ])
    .await;
    assert_eq!(
        (status, body.len()),
        (304, 0),
        "the browser's copy is current"
    );
    assert_eq!((unchanged_etag, cache.as_str()), (etag, "no-cache"));
    let (status, _, body) = fetch(vec![("if-none-match", "W/\"older\"".to_owned())]).await;
    assert_eq!((status, body), (200, on_disk), "a stale copy gets the file");
    service.running.stop().await;
}
