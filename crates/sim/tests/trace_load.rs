//! The openb CSV loaders: good files load, malformed rows are rejected with the
//! file, the line and the column.

use std::path::PathBuf;

use tessera_sim::trace::{parse_nodes, parse_pods};

const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

#[test]
fn loads_both_pod_layouts_and_nodes() {
    let pods = parse_pods(
        "p.csv",
        format!("{POD_HEADER}openb-pod-0001,6000,12288,1,460,V100M16|V100M32,LS,Running,10,20,\n")
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].gpu_milli, 460);
    assert_eq!(pods[0].gpu_spec, vec!["V100M16", "V100M32"]);
    assert_eq!(pods[0].creation_time, Some(10));
    assert_eq!(pods[0].scheduled_time, None);

    // The multigpu variants have five columns only.
    let pods = parse_pods(
        "m.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-0000,12000,16384,8,1000\n"
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(pods[0].num_gpu, 8);
    assert!(pods[0].gpu_spec.is_empty() && pods[0].creation_time.is_none());

    let nodes = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,64000,262144,2,P100\nopenb-node-0001,32000,1024,0,\n".as_bytes(),
    )
    .unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!((nodes[0].gpus, nodes[0].model.as_str()), (2, "P100"));
}

/// (file body after the header, expected line, expected column, words in the message)
const BAD_PODS: &[(&str, u64, Option<&str>, &str)] = &[
    (
        "p1,abc,1,0,0,,LS,Running,0,1,\n",
        2,
        Some("cpu_milli"),
        "`abc` is not an integer",
    ),
    (
        "p1,1000,1,0,0,,LS,Running,0,1,\np2,1000,-5,0,0,,LS,Running,0,1,\n",
        3,
        Some("memory_mib"),
        "-5 is outside",
    ),
    (
        "p1,1000,1,1,1500,,LS,Running,0,1,\n",
        2,
        Some("gpu_milli"),
        "1500 is outside",
    ),
    (
        "p1,1000,1,0,300,,LS,Running,0,1,\n",
        2,
        Some("gpu_milli"),
        "num_gpu is 0",
    ),
    (
        "p1,1000,1,2,500,,LS,Running,0,1,\n",
        2,
        Some("gpu_milli"),
        "only one GPU can be shared",
    ),
    (
        "p1,1000,1,1,0,,LS,Running,0,1,\n",
        2,
        Some("gpu_milli"),
        "num_gpu is 1",
    ),
    (
        "p1,1000,1,1,500,,LS,Running,9,3,\n",
        2,
        Some("deletion_time"),
        "before creation",
    ),
    (
        "p1,1000,1,1,500,,LS,Running\n",
        2,
        None,
        "fields where the header has 11",
    ),
    (
        ",1000,1,1,500,,LS,Running,0,1,\n",
        2,
        Some("name"),
        "empty name",
    ),
];

#[test]
fn malformed_pod_rows_name_file_line_and_column() {
    for (body, line, column, words) in BAD_PODS {
        let e = parse_pods("pods.csv", format!("{POD_HEADER}{body}").as_bytes()).unwrap_err();
        assert_eq!(e.file, "pods.csv", "{body}");
        assert_eq!(e.line, *line, "{body}: {e}");
        assert_eq!(e.column.as_deref(), *column, "{body}: {e}");
        assert!(e.message.contains(words), "{body}: {e}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("pods.csv:{line}")), "{shown}");
    }
}

#[test]
fn malformed_node_rows_and_headers() {
    let e = parse_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu\nx,1,1,1\n".as_bytes()).unwrap_err();
    assert_eq!((e.line, e.column.as_deref()), (1, Some("model")));
    let e = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nx,1,1,4,\n".as_bytes(),
    )
    .unwrap_err();
    assert_eq!((e.line, e.column.as_deref()), (2, Some("model")));
    assert!(e.message.contains("4 GPUs"));
    let e = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nx,1,1,two,T4\n".as_bytes(),
    )
    .unwrap_err();
    assert_eq!((e.line, e.column.as_deref()), (2, Some("gpu")));
    let e = parse_pods("p.csv", "name,cpu\n".as_bytes()).unwrap_err();
    assert_eq!(e.column.as_deref(), Some("cpu_milli"));
}

fn shared_traces() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/alibaba-gpu-v2023/csv");
    if p.is_dir() {
        Some(p)
    } else {
        eprintln!(
            "NOTE: {} is absent; checking only the copies in data/ (the other trace variants are not tested)",
            p.display()
        );
        None
    }
}

#[test]
fn the_repository_copies_load_with_the_published_counts() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/alibaba-gpu-v2023");
    let nodes = tessera_sim::trace::load_nodes(&data.join("openb_node_list_gpu_node.csv")).unwrap();
    let pods = tessera_sim::trace::load_pods(&data.join("openb_pod_list_default.csv")).unwrap();
    assert_eq!(nodes.len(), 1213);
    assert_eq!(nodes.iter().map(|n| n.gpus).sum::<u32>(), 6212);
    assert_eq!(pods.len(), 8152);
    assert_eq!(pods.iter().filter(|p| p.num_gpu == 0).count(), 1088);
    assert_eq!(
        pods.iter().filter(|p| p.scheduled_time.is_none()).count(),
        897
    );
}

#[test]
fn every_shared_variant_loads() {
    let Some(dir) = shared_traces() else { return };
    // (file, rows) from the trace README.
    let expect = [
        ("openb_node_list_all_node.csv", 1523),
        ("openb_pod_list_cpu050.csv", 7439),
        ("openb_pod_list_cpu250.csv", 9420),
        ("openb_pod_list_gpushare100.csv", 8152),
        ("openb_pod_list_gpuspec33.csv", 8152),
        ("openb_pod_list_multigpu50.csv", 9061),
    ];
    for (f, rows) in expect {
        let p = dir.join(f);
        let n = if f.contains("node") {
            tessera_sim::trace::load_nodes(&p).map(|v| v.len())
        } else {
            tessera_sim::trace::load_pods(&p).map(|v| v.len())
        };
        assert_eq!(n.unwrap(), rows, "{f}");
    }
    let spec = tessera_sim::trace::load_pods(&dir.join("openb_pod_list_gpuspec33.csv")).unwrap();
    assert_eq!(spec.iter().filter(|p| !p.gpu_spec.is_empty()).count(), 2388);
}
