//! `agora experiment`: listing and input errors. (Running an experiment at full size takes
//! minutes; the experiments themselves are tested at tiny scale in agora-sim.)

use std::process::Command;

fn agora(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agora"))
        .args(args)
        .output()
        .expect("the agora binary runs")
}

#[test]
fn list_names_every_experiment() {
    let output = agora(&["experiment", "--list"]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    for (name, _) in agora_sim::experiments::EXPERIMENTS {
        assert!(stdout.contains(name), "{name} missing from:\n{stdout}");
    }
}

#[test]
fn an_unknown_experiment_is_an_input_error() {
    let out = std::env::temp_dir().join(format!("agora-experiment-unknown-{}", std::process::id()));
    let output = agora(&[
        "experiment",
        "fig99",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("fig18-liar"),
        "{stderr}"
    );
}

#[test]
fn a_name_needs_an_output_directory() {
    let output = agora(&["experiment", "fig18-liar"]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "clap reports the missing --out"
    );
}
