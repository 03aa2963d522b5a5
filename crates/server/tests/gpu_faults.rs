//! A GPU fault through the whole server: the node's fault source reports an Xid
//! that is not confined to one task (79, fallen off the bus) on GPU 0; the node
//! reports a `GpuUnhealthy` condition, the heartbeat marks GPU 0 unhealthy in the
//! node record, and the live scheduler places no new work there: one-GPU jobs go
//! to GPU 1, a two-GPU job stays pending. A task's own Xid (31) marks nothing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Client, Server, StatusCode, Value, json};
use tessera_node::faults::{FakeFaults, FaultKind, FaultSource, GpuFault};
use tessera_node::gpu::{GpuSource, RawGpu};

#[derive(Debug)]
struct Gpus(Mutex<Vec<RawGpu>>);
impl GpuSource for Gpus {
    fn name(&self) -> &str {
        "fake"
    }
    fn gpus(&self) -> Result<Vec<RawGpu>, String> {
        Ok(self.0.lock().unwrap().clone())
    }
}

fn fake_gpus(dir: &std::path::Path, n: u32) -> Vec<RawGpu> {
    std::fs::create_dir_all(dir.join("dev")).unwrap();
    std::fs::write(dir.join("dev/nvidiactl"), b"").unwrap();
    (0..n)
        .map(|i| {
            std::fs::write(dir.join(format!("dev/nvidia{i}")), b"").unwrap();
            RawGpu {
                index: i,
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory: 80 << 30,
                bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
                uuid: format!("GPU-fake-{i}"),
                minor: Some(i),
                ..RawGpu::default()
            }
        })
        .collect()
}

fn gpu_job(name: &str, count: u32) -> Value {
    json!({"name": name, "queue": "q", "tasks": [
        {"name": "t", "resources": {"cpu_milli": 100, "memory": 67108864},
         "gpu": {"whole": {"count": count}},
         "command": ["true"]}]})
}

async fn ended(c: &Client, job: &str) -> Value {
    c.wait_for(&format!("/v1/jobs/{job}"), |v| {
        matches!(
            v["status"]["phase"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_fault_stops_placement_on_that_gpu() {
    if !common::can_run_tasks("a_gpu_fault_stops_placement_on_that_gpu") {
        return;
    }
    let fakes = tempfile::tempdir().unwrap();
    let src = Arc::new(Gpus(Mutex::new(fake_gpus(fakes.path(), 2))));
    let faults = Arc::new(FakeFaults::default());
    let s = Server::start_with(|c| {
        c.scheduler = Some(tessera_server::scheduler::batch_scheduler());
        c.node.gpus = Some(src.clone() as Arc<dyn GpuSource>);
        c.node.faults = Some(faults.clone() as Arc<dyn FaultSource>);
        c.node.devices = tessera_node::DeviceDirs {
            dev: fakes.path().join("dev"),
            caps: fakes.path().join("caps"),
        };
        c.node.heartbeat = Duration::from_millis(100);
    })
    .await;
    let a = s.tenant("alpha").await;
    let (st, v) = a.post("/v1/queues", json!({"name": "q"})).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = a.post("/v1/jobs", gpu_job("first", 1)).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let v = ended(&a, "first").await;
    assert_eq!(v["status"]["phase"], "succeeded", "{v}");
    let node = v["status"]["tasks"]["t"]["node"]
        .as_str()
        .unwrap()
        .to_string();
    let fault = |x| GpuFault {
        device_index: 0,
        uuid: Some("GPU-fake-0".into()),
        kind: FaultKind::Xid(Some(x)),
    };
    // A task's own fault, then the GPU's.
    faults.push(fault(31));
    faults.push(fault(79));
    let n = a
        .wait_for(&format!("/v1/nodes/{node}"), |n| {
            n["gpus"][0]["unhealthy"].is_string()
        })
        .await;
    assert!(
        n["gpus"][0]["unhealthy"]
            .as_str()
            .unwrap()
            .contains("Xid 79"),
        "{n}"
    );
    assert!(n["gpus"][1].get("unhealthy").is_none(), "{n}");
    let n = a
        .wait_for(&format!("/v1/nodes/{node}"), |n| {
            n["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["kind"] == "GpuUnhealthy" && c["status"] == true)
            })
        })
        .await;
    let c = n["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "GpuUnhealthy")
        .unwrap()
        .clone();
    assert!(
        c["message"].as_str().unwrap().contains("GPU 0: Xid 79"),
        "{c}"
    );
    // New work goes to GPU 1 only.
    for name in ["second", "third"] {
        let (st, v) = a.post("/v1/jobs", gpu_job(name, 1)).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        let v = ended(&a, name).await;
        assert_eq!(v["status"]["phase"], "succeeded", "{v}");
        assert_eq!(v["status"]["tasks"]["t"]["gpus"][0], 1, "{v}");
    }
    // Two GPUs no longer fit the node.
    let (st, v) = a.post("/v1/jobs", gpu_job("both", 2)).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, v) = a.get("/v1/jobs/both").await;
    assert_eq!(v["status"]["phase"], "pending", "{v}");
}
