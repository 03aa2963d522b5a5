//! A GPU the node marked unhealthy (`GpuDevice::unhealthy`, after an Xid / ECC
//! fault) gets no new work: whole, shared and MIG requests go to the others, and
//! a node whose only fitting GPU is unhealthy does not fit.

use tessera_model::mig::MigLayout;
use tessera_model::{GpuDevice, GpuRequest, Node, Resources};
use tessera_sched::gpu::NodeGpus;

fn node(unhealthy: &[u32]) -> Node {
    let mut n = Node::new("n", Resources::new(64_000, 1 << 40).with_gpu_milli(4000));
    n.gpus = (0..4)
        .map(|i| {
            let mut g = GpuDevice::new(i, "H100-80GB", 80 << 30);
            if unhealthy.contains(&i) {
                g.unhealthy = Some("Xid 79: GPU has fallen off the bus".into());
            }
            g
        })
        .collect();
    n
}

#[test]
fn unhealthy_gpus_get_no_new_work() {
    let whole = |count| GpuRequest::Whole {
        count,
        models: vec![],
    };
    let shared = GpuRequest::Shared {
        milli: 300,
        memory: 10 << 30,
        models: vec![],
    };
    let healthy = NodeGpus::from_node(&node(&[]));
    assert_eq!(healthy.select(&whole(1)), Some(vec![0]));
    assert_eq!(healthy.whole_free(), 4);

    let g = NodeGpus::from_node(&node(&[0, 2]));
    assert_eq!(g.whole_free(), 2);
    assert_eq!(g.select(&whole(1)), Some(vec![1]));
    assert_eq!(g.select(&whole(2)), Some(vec![1, 3]));
    assert_eq!(g.select(&whole(3)), None);
    let s = g.select(&shared).unwrap();
    assert!(s == [1] || s == [3], "{s:?}");
    assert_eq!(
        NodeGpus::from_node(&node(&[0, 1, 2, 3])).select(&shared),
        None
    );

    // MIG: the only MIG GPU is unhealthy, so no instance is made there.
    let mut n = node(&[0]);
    n.gpus[0].mig = Some(MigLayout::default());
    let mig = GpuRequest::Mig {
        profile: "1g.10gb".into(),
        models: vec![],
    };
    assert!(NodeGpus::from_node(&n).select(&mig).is_none());
    n.gpus[0].unhealthy = None;
    assert!(NodeGpus::from_node(&n).select(&mig).is_some());
}
