//! The curriculum: frontier vs uniform sampling statistics, new-task share, Limit vs Infra
//! accounting, the synthesis request, save/load.

use frognano_rl::curriculum::Curriculum;
use frognano_rl::env::Direction;
use frognano_rl::rollout::Outcome;
use frognano_synth::calibrate::{FrontierConfig, Lifecycle};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn scored(r: f32) -> Outcome {
    Outcome::Scored { reward: r }
}
fn limit() -> Outcome {
    Outcome::Limit { reason: "max_turns".into() }
}
fn infra() -> Outcome {
    Outcome::Infra { reason: "sandbox".into() }
}

/// A pool of 12 tasks: 4 easy (always solved), 4 at the frontier, 4 never solved.
fn pool(mut c: Curriculum) -> Curriculum {
    for i in 0..4 {
        c.record(&format!("easy{i}"), &vec![scored(1.0); 8], 1);
        c.record(&format!("mid{i}"), &[scored(1.0), scored(0.0), scored(1.0), scored(0.0)], 1);
        c.record(&format!("hard{i}"), &vec![scored(0.0); 8], 1);
    }
    c
}

fn draws(c: &Curriculum, kind: &str) -> usize {
    let mut rng = StdRng::seed_from_u64(3);
    (0..300).map(|_| c.sample(4, 1, &mut rng).iter().filter(|id| id.starts_with(kind)).count()).sum()
}

#[test]
fn frontier_favours_the_band_and_uniform_does_not() {
    let f = pool(Curriculum::frontier(FrontierConfig::default()));
    let u = pool(Curriculum::uniform());
    // 300 batches of 4 from 12 tasks: uniform gives each kind a third (400 draws).
    let (f_mid, u_mid) = (draws(&f, "mid"), draws(&u, "mid"));
    assert!((330..=470).contains(&u_mid), "uniform mid draws {u_mid}");
    assert!(f_mid > 560, "frontier mid draws {f_mid}");
    assert!(draws(&f, "easy") < draws(&u, "easy"));
    // Same estimates either way: the same metrics.
    assert_eq!(f.histogram(), u.histogram());
    assert_eq!(f.band_report(), u.band_report());
    assert_eq!(f.histogram().iter().sum::<usize>(), 12);
    // Batches are distinct ids.
    let mut rng = StdRng::seed_from_u64(9);
    for c in [&f, &u] {
        let b = c.sample(6, 1, &mut rng);
        let set: std::collections::BTreeSet<_> = b.iter().collect();
        assert_eq!(set.len(), b.len());
    }
}

#[test]
fn new_tasks_get_their_reserved_share() {
    let mut c = pool(Curriculum::frontier(FrontierConfig::default()));
    c.add_tasks(&["fresh0", "fresh1"]);
    let mut rng = StdRng::seed_from_u64(1);
    let b = c.sample(8, 2, &mut rng);
    assert_eq!(b.iter().filter(|id| id.starts_with("fresh")).count(), 2, "{b:?}");
}

#[test]
fn limits_count_as_failures_and_infra_is_not_counted() {
    let mut c = Curriculum::frontier(FrontierConfig::default());
    c.record("t", &[scored(1.0), limit(), infra(), infra()], 0);
    let e = c.estimate("t").unwrap();
    assert_eq!((e.successes, e.failures), (1.0, 1.0));
    c.record("only_infra", &[infra(), infra()], 0);
    let e = c.estimate("only_infra").unwrap();
    assert_eq!((e.n(), e.state), (0.0, Lifecycle::New));
    // Partial credit below 1 is a failure for the estimate.
    c.record("p", &[scored(0.5)], 0);
    assert_eq!(c.estimate("p").unwrap().failures, 1.0);
}

#[test]
fn needs_tasks_follows_the_out_of_band_mass() {
    let mut c = Curriculum::frontier(FrontierConfig { batch: 2, ..Default::default() });
    for i in 0..6 {
        c.record(&format!("easy{i}"), &vec![scored(1.0); 8], 1);
    }
    assert_eq!(c.needs_tasks(), Some((Direction::Harder, 4)));
    for i in 0..10 {
        c.record(&format!("hard{i}"), &vec![scored(0.0); 8], 1);
    }
    assert_eq!(c.needs_tasks(), Some((Direction::Easier, 4)));
    // While the tasks of a request are being measured, no further request.
    c.add_tasks(&["n0", "n1", "n2"]);
    assert_eq!(c.needs_tasks(), Some((Direction::Easier, 4)));
    c.add_tasks(&["n3"]);
    assert_eq!(c.needs_tasks(), None);
    c.record("n3", &[scored(0.0)], 2);
    assert_eq!(c.needs_tasks(), None, "calibrating tasks count as pending too");
    assert_eq!(pool(Curriculum::uniform()).needs_tasks(), None);
}

#[test]
fn save_and_load_round_trip() {
    let c = pool(Curriculum::frontier(FrontierConfig::default()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("curriculum.json");
    c.save(&path).unwrap();
    assert_eq!(Curriculum::load(&path).unwrap(), c);
    std::fs::write(&path, "{").unwrap();
    assert!(Curriculum::load(&path).unwrap_err().to_string().contains("not a saved curriculum"));
}
