//! Job files as people write them (docs/api.md, "Job files"): the scenario format's short
//! words are folded into the stored form, the canonical forms still read, and every
//! mistake names its field. Parsed the way the server parses a body: YAML or JSON through
//! `serde_path_to_error`, then `JobSpec::normalize`.

use serde_json::json;
use tessera_model::{GpuRequest, Resources};
use tessera_server::wire::{JobSpec, QueueSpec};

/// (field, message) of a rejected file, or the normalized job.
fn yaml(text: &str) -> Result<JobSpec, (String, String)> {
    let spec: JobSpec =
        serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text))
            .map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
    spec.normalize()
}

fn task_yaml(task: &str) -> Result<JobSpec, (String, String)> {
    yaml(&format!("name: j\nqueue: q\ntasks:\n  - name: t\n{task}"))
}

fn gpu(task: &str) -> GpuRequest {
    task_yaml(task).unwrap().tasks[0].gpu.clone()
}

fn err(task: &str) -> (String, String) {
    task_yaml(task).expect_err("the file must be refused")
}

const GI: u64 = 1 << 30;

#[test]
fn gpu_requests_in_every_spelling() {
    let eight = GpuRequest::Whole {
        count: 8,
        models: vec![],
    };
    assert_eq!(gpu("    gpu: 8\n"), eight);
    assert_eq!(gpu("    gpu: {whole: {count: 8}}\n"), eight);
    assert_eq!(gpu("    gpu: !whole {count: 8}\n"), eight);
    assert_eq!(gpu("    gpu: \"8\"\n"), eight);
    assert_eq!(gpu("    gpu: none\n"), GpuRequest::None);
    assert_eq!(gpu("    gpu: 0\n"), GpuRequest::None);
    assert_eq!(
        gpu("    gpu: 2\n    gpu_models: [H100-80GB]\n"),
        GpuRequest::Whole {
            count: 2,
            models: vec!["H100-80GB".into()]
        }
    );
    assert_eq!(
        gpu("    gpu_milli: 250\n    gpu_memory: 20Gi\n    gpu_models: [A100-80GB]\n"),
        GpuRequest::Shared {
            milli: 250,
            memory: 20 * GI,
            models: vec!["A100-80GB".into()]
        }
    );
    assert_eq!(
        gpu("    mig: 3g.40gb\n"),
        GpuRequest::Mig {
            profile: "3g.40gb".into(),
            models: vec![]
        }
    );
    assert_eq!(
        gpu("    gpu: !mig {profile: 1g.10gb}\n"),
        GpuRequest::Mig {
            profile: "1g.10gb".into(),
            models: vec![]
        }
    );
}

#[test]
fn resources_in_both_spellings() {
    let r = task_yaml("    resources: {cpu: 4, memory: 16Gi, pods: 1}\n").unwrap();
    assert_eq!(
        r.tasks[0].resources,
        Resources {
            cpu_milli: 4000,
            memory: 16 * GI,
            pods: 1,
            ..Resources::ZERO
        }
    );
    let r = task_yaml("    resources: {cpu: 500m, memory: 512M}\n").unwrap();
    assert_eq!(
        (r.tasks[0].resources.cpu_milli, r.tasks[0].resources.memory),
        (500, 512_000_000)
    );
    let r = task_yaml("    resources: {cpu: 0.25}\n").unwrap();
    assert_eq!(r.tasks[0].resources.cpu_milli, 250);
    let r = task_yaml("    resources: {cpu_milli: 100, memory: 1048576}\n").unwrap();
    assert_eq!(
        (r.tasks[0].resources.cpu_milli, r.tasks[0].resources.memory),
        (100, 1 << 20)
    );
    let q: QueueSpec = serde_norway::from_str(
        "name: q\nguarantee: {gpu: 8, cpu: 16}\ncapability: {gpu: 0.5, memory: 1Ti}\n",
    )
    .unwrap();
    assert_eq!(
        (q.guarantee.gpu_milli, q.guarantee.cpu_milli),
        (8000, 16000)
    );
    let cap = q.capability.unwrap();
    assert_eq!((cap.gpu_milli, cap.memory), (500, 1 << 40));
}

#[test]
fn replicas_make_tasks_alike() {
    let j = task_yaml("    replicas: 3\n    gpu: 8\n    command: [python, train.py]\n").unwrap();
    let names: Vec<_> = j.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["t-0", "t-1", "t-2"]);
    assert!(j.tasks.iter().all(|t| t.command == ["python", "train.py"]
        && t.gpu
            == GpuRequest::Whole {
                count: 8,
                models: vec![]
            }));
    assert_eq!(j.min_member(), 3, "a gang of all replicas by default");
    // `replicas: 1` keeps the name as written.
    assert_eq!(task_yaml("    replicas: 1\n").unwrap().tasks[0].name, "t");
}

#[test]
fn the_stored_form_is_canonical_and_reads_back() {
    let j = task_yaml("    replicas: 2\n    gpu_milli: 300\n    resources: {cpu: 1}\n").unwrap();
    let stored = serde_json::to_value(&j).unwrap();
    for t in stored["tasks"].as_array().unwrap() {
        for word in ["replicas", "gpu_milli", "gpu_memory", "gpu_models", "mig"] {
            assert!(t.get(word).is_none(), "{word} stored: {t}");
        }
        assert_eq!(
            t["gpu"],
            json!({"shared": {"milli": 300, "memory": 0}}),
            "{t}"
        );
        assert_eq!(t["resources"]["cpu_milli"], 1000, "{t}");
    }
    let back: JobSpec = serde_json::from_value(stored).unwrap();
    assert_eq!(back.normalize().unwrap(), j);
}

#[test]
fn every_mistake_names_its_field() {
    let cases: &[(&str, &str, &str)] = &[
        ("    gpu: 1.5\n", "tasks[0].gpu", "gpu_milli: 500"),
        ("    gpu: -2\n", "tasks[0].gpu", "0 or more"),
        ("    gpu: 3g.40gb\n", "tasks[0].gpu", "mig: 3g.40gb"),
        (
            "    gpu: 2\n    gpu_milli: 250\n",
            "tasks[0].gpu",
            "give gpu for whole",
        ),
        ("    gpu_milli: 1500\n", "tasks[0].gpu_milli", "1 to 999"),
        ("    gpu_milli: 0\n", "tasks[0].gpu_milli", "1 to 999"),
        (
            "    gpu_milli: 250\n    mig: 3g.40gb\n",
            "tasks[0].mig",
            "give one",
        ),
        (
            "    mig: 3g.40gb\n    gpu_memory: 40Gi\n",
            "tasks[0].gpu_memory",
            "profile",
        ),
        ("    gpu_memory: 4Gi\n", "tasks[0].gpu_memory", "gpu_milli"),
        (
            "    gpu_milli: 100\n    gpu_memory: lots\n",
            "tasks[0].gpu_memory",
            "lots",
        ),
        (
            "    gpu_models: [A100]\n",
            "tasks[0].gpu_models",
            "without a GPU request",
        ),
        ("    replicas: 0\n", "tasks[0].replicas", "1 or more"),
        (
            "    replicas: 10001\n",
            "tasks[0].replicas",
            "at most 10000",
        ),
        (
            "    resources: {cpu: 2, cpu_milli: 2000}\n",
            "tasks[0].resources",
            "cpu and cpu_milli",
        ),
        ("    resources: {cpu: lots}\n", "tasks[0].resources", "lots"),
        (
            "    resources: {memory: 1.5}\n",
            "tasks[0].resources",
            "16Gi",
        ),
        (
            "    resources: {colour: red}\n",
            "tasks[0].resources.colour",
            "colour",
        ),
        ("    gpus: 8\n", "tasks[0].gpus", "gpus"),
    ];
    for (task, field, hint) in cases {
        let (f, m) = err(task);
        assert_eq!(&f, field, "{task:?}: {m}");
        assert!(m.contains(hint), "{task:?}: {m:?} lacks {hint:?}");
    }
    // Replicas count towards one job's limit across entries.
    let many =
        "name: j\nqueue: q\ntasks:\n  - {name: a, replicas: 6000}\n  - {name: b, replicas: 6000}\n";
    let (f, m) = yaml(many).unwrap_err();
    assert_eq!(f, "tasks[1].replicas", "{m}");
    assert!(m.contains("6000 before this entry"), "{m}");
}
