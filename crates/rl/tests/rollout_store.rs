//! The rollout store (round trip, torn tail, damage) and the training sequence built from
//! turn records (alignment, broken prefix, exit accounting).

use frognano_engine::TurnRecord;
use frognano_rl::rollout::{build_sequence, outcome_of_exit, Outcome, Rollout, PREFIX_BROKEN};
use frognano_rl::store::{read_all, read_all_with_warnings, RolloutStore, ARRAYS, INDEX};

fn turn(prompt: &[u32], sampled: &[u32]) -> TurnRecord {
    TurnRecord {
        prompt_ids: prompt.to_vec(),
        sampled_ids: sampled.to_vec(),
        logprobs: sampled.iter().map(|&t| -(t as f32) / 10.0).collect(),
        stopped: true,
        continued: true,
    }
}

#[test]
fn sequence_aligns_weights_and_logprobs_with_tokens() {
    let turns = [turn(&[1, 2, 3], &[4, 5]), turn(&[1, 2, 3, 4, 5, 6, 7], &[8, 9])];
    let s = build_sequence(&turns).unwrap();
    assert_eq!(s.tokens, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(s.weights, vec![0, 0, 0, 1, 1, 0, 0, 1, 1]);
    assert_eq!(s.logprobs, vec![0.0, 0.0, 0.0, -0.4, -0.5, 0.0, 0.0, -0.8, -0.9]);
    assert_eq!(s.turn_starts, vec![3, 7]);
}

#[test]
fn a_broken_prefix_is_an_infra_outcome_with_the_valid_prefix() {
    let turns = [turn(&[1, 2, 3], &[4, 5]), turn(&[1, 2, 3, 4, 6, 7], &[8])];
    let r = Rollout::from_turns("t", 1, &turns, "agent", Outcome::Scored { reward: 1.0 }, 0.5);
    match &r.outcome {
        Outcome::Infra { reason } => assert!(reason.starts_with(PREFIX_BROKEN) && reason.contains("position 4")),
        o => panic!("{o:?}"),
    }
    assert_eq!(r.tokens, vec![1, 2, 3, 4, 5]);
    assert!(!r.trainable());
}

#[test]
fn exits_map_to_outcomes() {
    assert_eq!(outcome_of_exit("agent", None), None);
    assert_eq!(outcome_of_exit("max_turns", None), Some(Outcome::Limit { reason: "max_turns".into() }));
    assert!(
        matches!(outcome_of_exit("llm_query_error", Some("boom")), Some(Outcome::Infra { reason }) if reason == "llm_query_error: boom")
    );
    assert!(matches!(outcome_of_exit("cancelled", None), Some(Outcome::Infra { .. })));
}

fn rollout(i: u64, n: usize) -> Rollout {
    Rollout {
        task_id: format!("task-{i}"),
        group: i / 2,
        attempt: (i % 2) as u32,
        policy_version: 3,
        seed: 100 + i,
        tokens: (0..n as u32).map(|t| t * 7 + i as u32).collect(),
        logprobs: (0..n).map(|t| -(t as f32) * 0.25).collect(),
        weights: (0..n).map(|t| u8::from(t.is_multiple_of(3))).collect(),
        turn_starts: vec![0, n / 2],
        exit: "agent".into(),
        outcome: if i.is_multiple_of(2) {
            Outcome::Scored { reward: 1.0 }
        } else {
            Outcome::Limit { reason: "max_turns".into() }
        },
        wall_s: 1.5,
    }
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let rs: Vec<Rollout> = (0..5).map(|i| rollout(i, 10 + i as usize)).collect();
    {
        let mut s = RolloutStore::open(dir.path()).unwrap();
        for r in &rs[..3] {
            s.append(r).unwrap();
        }
    }
    // Reopening appends after what is there.
    let mut s = RolloutStore::open(dir.path()).unwrap();
    for r in &rs[3..] {
        s.append(r).unwrap();
    }
    let back = read_all_with_warnings(dir.path()).unwrap();
    assert!(back.warnings.is_empty());
    assert_eq!(back.rollouts, rs);
    let empty = tempfile::tempdir().unwrap();
    assert!(read_all(empty.path()).unwrap().is_empty());
}

#[test]
fn a_torn_tail_is_ignored_and_cut_before_the_next_append() {
    let dir = tempfile::tempdir().unwrap();
    let rs: Vec<Rollout> = (0..3).map(|i| rollout(i, 8)).collect();
    let mut s = RolloutStore::open(dir.path()).unwrap();
    for r in &rs {
        s.append(r).unwrap();
    }
    drop(s);
    // A crash in the middle of the third index line.
    let index = dir.path().join(INDEX);
    let text = std::fs::read(&index).unwrap();
    std::fs::write(&index, &text[..text.len() - 20]).unwrap();
    let back = read_all_with_warnings(dir.path()).unwrap();
    assert_eq!(back.rollouts, rs[..2].to_vec());
    assert_eq!(back.warnings.len(), 1, "{:?}", back.warnings);
    // Appending after the crash starts a clean line.
    let mut s = RolloutStore::open(dir.path()).unwrap();
    s.append(&rs[2]).unwrap();
    let back = read_all_with_warnings(dir.path()).unwrap();
    assert_eq!(back.rollouts, rs);
    assert!(back.warnings.is_empty());
}

#[test]
fn a_complete_line_whose_arrays_are_missing_is_ignored_at_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = RolloutStore::open(dir.path()).unwrap();
    s.append(&rollout(0, 6)).unwrap();
    s.append(&rollout(1, 6)).unwrap();
    drop(s);
    let arrays = dir.path().join(ARRAYS);
    let bytes = std::fs::read(&arrays).unwrap();
    std::fs::write(&arrays, &bytes[..bytes.len() - 5]).unwrap();
    let back = read_all_with_warnings(dir.path()).unwrap();
    assert_eq!(back.rollouts.len(), 1);
    assert_eq!(back.warnings.len(), 1);
}

#[test]
fn damage_before_the_tail_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = RolloutStore::open(dir.path()).unwrap();
    s.append(&rollout(0, 4)).unwrap();
    s.append(&rollout(1, 4)).unwrap();
    drop(s);
    let index = dir.path().join(INDEX);
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, format!("{{oops\n{text}")).unwrap();
    let e = read_all(dir.path()).unwrap_err().to_string();
    assert!(e.contains(":1: not a rollout index record"), "{e}");
}

#[test]
fn unequal_arrays_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = RolloutStore::open(dir.path()).unwrap();
    let mut r = rollout(0, 4);
    r.weights.pop();
    assert!(s.append(&r).is_err());
}
