//! `kai_ray_native`: the Rust core behind `kai_ray.core.schedule.schedule`. It reads the
//! Python `Snapshot` and `SchedulerConfig` (kai_ray/core/model.py) attribute by attribute,
//! runs `kai_ray_core::schedule`, and builds the `CycleResult` with the classes the caller
//! passes in (kai_ray/core/result.py), reusing the snapshot's own name objects.
//!
//! `schedule` returns a string saying why for what the native core does not take (an unknown
//! packing policy, duplicate job names, a value of an unexpected type): the Python core runs
//! then.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use rustc_hash::FxHashMap;

use kai_ray_core::constraints::{Requirement, Taint, Toleration};
use kai_ray_core::model::{
    Constraints, GpuPacking, Job, Node, Pod, PodStatus, Queue, Request, ResourceQuota,
    SchedulerConfig, Snapshot, SubGroup,
};
use kai_ray_core::packing::request_valid;

// the session makes and drops hundreds of thousands of small vectors and strings a cycle
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Why the snapshot is not for the native core (the Python core takes it).
struct Unsupported(String);

type Conv<T> = Result<T, Unsupported>;

impl From<PyErr> for Unsupported {
    fn from(e: PyErr) -> Self {
        Unsupported(format!("an unexpected value: {e}"))
    }
}

fn attr<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> Conv<Bound<'py, PyAny>> {
    Ok(obj.getattr(name)?)
}

fn int(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<i64> {
    Ok(attr(obj, name)?.extract::<i64>()?)
}

fn float(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<f64> {
    Ok(attr(obj, name)?.extract::<f64>()?)
}

fn boolean(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<bool> {
    Ok(attr(obj, name)?.is_truthy()?)
}

fn string(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<String> {
    Ok(attr(obj, name)?.extract::<String>()?)
}

fn opt_string(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<Option<String>> {
    let value = attr(obj, name)?;
    if value.is_none() {
        Ok(None)
    } else {
        Ok(Some(value.extract::<String>()?))
    }
}

fn opt_float(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<Option<f64>> {
    let value = attr(obj, name)?;
    if value.is_none() {
        Ok(None)
    } else {
        Ok(Some(value.extract::<f64>()?))
    }
}

fn opt_int(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>) -> Conv<Option<i64>> {
    let value = attr(obj, name)?;
    if value.is_none() {
        Ok(None)
    } else {
        Ok(Some(value.extract::<i64>()?))
    }
}

fn items<'py>(obj: &Bound<'py, PyAny>) -> Conv<Vec<Bound<'py, PyAny>>> {
    // the snapshot's sequences are tuples (a pod's devices, constraints, a job's pods): read
    // by index, without Python's iterator protocol
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    Ok(obj.try_iter()?.collect::<PyResult<Vec<_>>>()?)
}

fn pairs(obj: &Bound<'_, PyAny>) -> Conv<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in items(obj)? {
        out.push(item.extract::<(String, String)>()?);
    }
    Ok(out)
}

/// The snapshot's Python objects the result reuses: names, namespaces, device-id tuples.
struct Names {
    pod_names: Vec<Py<PyAny>>,
    pod_groups: Vec<Py<PyAny>>,
    job_names: Vec<Py<PyAny>>,
    job_namespaces: Vec<Py<PyAny>>,
    /// the job of each pod, in snapshot order
    pod_job: Vec<usize>,
}

fn read_taints(obj: &Bound<'_, PyAny>) -> Conv<Vec<Taint>> {
    let py = obj.py();
    let mut out = Vec::new();
    for t in items(obj)? {
        out.push(Taint {
            key: string(&t, intern!(py, "key"))?,
            value: string(&t, intern!(py, "value"))?,
            effect: string(&t, intern!(py, "effect"))?,
        });
    }
    Ok(out)
}

fn read_nodes(snapshot: &Bound<'_, PyAny>) -> Conv<Vec<Node>> {
    let py = snapshot.py();
    let mut nodes = Vec::new();
    for n in items(&attr(snapshot, intern!(py, "nodes"))?)? {
        nodes.push(Node {
            name: string(&n, intern!(py, "name"))?,
            cpu_m: int(&n, intern!(py, "cpu_m"))?,
            memory: int(&n, intern!(py, "memory"))?,
            gpus: int(&n, intern!(py, "gpus"))?,
            gpu_memory_mib: int(&n, intern!(py, "gpu_memory_mib"))?,
            gpu_memory_synced: boolean(&n, intern!(py, "gpu_memory_synced"))?,
            max_pods: int(&n, intern!(py, "max_pods"))?,
            labels: pairs(&attr(&n, intern!(py, "labels"))?)?,
            ready: boolean(&n, intern!(py, "ready"))?,
            unschedulable: boolean(&n, intern!(py, "unschedulable"))?,
            foreign_cpu_m: int(&n, intern!(py, "foreign_cpu_m"))?,
            foreign_memory: int(&n, intern!(py, "foreign_memory"))?,
            foreign_gpus: int(&n, intern!(py, "foreign_gpus"))?,
            foreign_pods: int(&n, intern!(py, "foreign_pods"))?,
            taints: read_taints(&attr(&n, intern!(py, "taints"))?)?,
        });
    }
    Ok(nodes)
}

fn read_quota(obj: &Bound<'_, PyAny>) -> Conv<ResourceQuota> {
    let py = obj.py();
    Ok(ResourceQuota {
        quota: float(obj, intern!(py, "quota"))?,
        limit: float(obj, intern!(py, "limit"))?,
        weight: float(obj, intern!(py, "weight"))?,
    })
}

/// The queues, and each name's Queue object (the last of a name, as the Python core keeps it).
fn read_queues<'py>(snapshot: &Bound<'py, PyAny>) -> Conv<(Vec<Queue>, QueueObjects)> {
    let py = snapshot.py();
    let mut queues = Vec::new();
    let mut objects = FxHashMap::default();
    for q in items(&attr(snapshot, intern!(py, "queues"))?)? {
        objects.insert(string(&q, intern!(py, "name"))?, q.clone().unbind());
        queues.push(Queue {
            name: string(&q, intern!(py, "name"))?,
            parent: opt_string(&q, intern!(py, "parent"))?,
            priority: int(&q, intern!(py, "priority"))?,
            gpu: read_quota(&attr(&q, intern!(py, "gpu"))?)?,
            cpu: read_quota(&attr(&q, intern!(py, "cpu"))?)?,
            memory: read_quota(&attr(&q, intern!(py, "memory"))?)?,
            created: float(&q, intern!(py, "created"))?,
            preempt_min_runtime_s: opt_float(&q, intern!(py, "preempt_min_runtime_s"))?,
            reclaim_min_runtime_s: opt_float(&q, intern!(py, "reclaim_min_runtime_s"))?,
        });
    }
    Ok((queues, objects))
}

type QueueObjects = FxHashMap<String, Py<PyAny>>;

fn read_request(obj: &Bound<'_, PyAny>) -> Conv<Request> {
    let py = obj.py();
    Ok(Request {
        cpu_m: int(obj, intern!(py, "cpu_m"))?,
        memory: int(obj, intern!(py, "memory"))?,
        gpus: int(obj, intern!(py, "gpus"))?,
        gpu_fraction_milli: int(obj, intern!(py, "gpu_fraction_milli"))?,
        gpu_memory_mib: int(obj, intern!(py, "gpu_memory_mib"))?,
        fraction_devices: int(obj, intern!(py, "fraction_devices"))?,
    })
}

fn read_constraints(pod: &Bound<'_, PyAny>) -> Conv<Option<Constraints>> {
    let py = pod.py();
    let selector = attr(pod, intern!(py, "node_selector"))?;
    let tolerations = attr(pod, intern!(py, "tolerations"))?;
    let affinity = attr(pod, intern!(py, "node_affinity"))?;
    if !selector.is_truthy()? && !tolerations.is_truthy()? && affinity.is_none() {
        return Ok(None);
    }
    let mut tols = Vec::new();
    for t in items(&tolerations)? {
        tols.push(Toleration {
            key: string(&t, intern!(py, "key"))?,
            operator: string(&t, intern!(py, "operator"))?,
            value: string(&t, intern!(py, "value"))?,
            effect: string(&t, intern!(py, "effect"))?,
        });
    }
    let node_affinity = if affinity.is_none() {
        None
    } else {
        let mut terms = Vec::new();
        for term in items(&affinity)? {
            let mut reqs = Vec::new();
            for r in items(&term)? {
                let values = items(&attr(&r, intern!(py, "values"))?)?
                    .iter()
                    .map(|v| v.extract::<String>())
                    .collect::<PyResult<Vec<_>>>()?;
                reqs.push(Requirement {
                    key: string(&r, intern!(py, "key"))?,
                    operator: string(&r, intern!(py, "operator"))?,
                    values,
                    field: boolean(&r, intern!(py, "field"))?,
                });
            }
            terms.push(reqs);
        }
        Some(terms)
    };
    Ok(Some(Constraints { node_selector: pairs(&selector)?, tolerations: tols, node_affinity }))
}

fn read_jobs(snapshot: &Bound<'_, PyAny>, out: &mut Snapshot) -> Conv<Names> {
    let py = snapshot.py();
    let mut names = Names {
        pod_names: Vec::new(),
        pod_groups: Vec::new(),
        job_names: Vec::new(),
        job_namespaces: Vec::new(),
        pod_job: Vec::new(),
    };
    let mut constraint_ids: FxHashMap<Constraints, usize> = FxHashMap::default();
    out.constraints.push(Constraints::default());
    constraint_ids.insert(Constraints::default(), 0);
    // many pods share a Request (a gang's pods): read each object once
    let mut requests: FxHashMap<usize, Request> = FxHashMap::default();
    let mut statuses: FxHashMap<usize, PodStatus> = FxHashMap::default();
    let mut seen_jobs: rustc_hash::FxHashSet<String> = rustc_hash::FxHashSet::default();
    // namespaces and queue names: a few distinct strings, often the same objects; read once each
    let mut known: FxHashMap<usize, String> = FxHashMap::default();
    let mut read_str = |obj: &Bound<'_, PyAny>| -> Conv<String> {
        if let Some(s) = known.get(&(obj.as_ptr() as usize)) {
            return Ok(s.clone());
        }
        let s: String = obj.extract()?;
        known.insert(obj.as_ptr() as usize, s.clone());
        Ok(s)
    };
    let jobs = items(&attr(snapshot, intern!(py, "jobs"))?)?;
    out.jobs.reserve(jobs.len());
    names.job_names.reserve(jobs.len());
    names.job_namespaces.reserve(jobs.len());
    for j in jobs {
        let name_obj = attr(&j, intern!(py, "name"))?;
        let name: String = name_obj.extract()?;
        if !seen_jobs.insert(name.clone()) {
            // the Python core keeps the last job of a name
            return Err(Unsupported(format!("two jobs are named {name:?}")));
        }
        let namespace_obj = attr(&j, intern!(py, "namespace"))?;
        let priority = int(&j, intern!(py, "priority"))?;
        let preemptible = attr(&j, intern!(py, "preemptible"))?;
        let preemptible =
            if preemptible.is_none() { priority < 100 } else { preemptible.is_truthy()? };
        let mut subgroups = Vec::new();
        for sg in items(&attr(&j, intern!(py, "subgroups"))?)? {
            subgroups.push(SubGroup {
                name: string(&sg, intern!(py, "name"))?,
                min_member: int(&sg, intern!(py, "min_member"))?,
                replica_size: int(&sg, intern!(py, "replica_size"))?,
                admitted_min_member: opt_int(&sg, intern!(py, "admitted_min_member"))?,
            });
        }
        let job_index = names.job_names.len();
        let pod_list = items(&attr(&j, intern!(py, "pods"))?)?;
        let mut pods = Vec::with_capacity(pod_list.len());
        for p in pod_list {
            let request_obj = attr(&p, intern!(py, "request"))?;
            let request = match requests.get(&(request_obj.as_ptr() as usize)) {
                Some(r) => *r,
                None => {
                    let r = read_request(&request_obj)?;
                    if r.is_shared() && r.fraction_devices < 1 {
                        // the Python core slices its device list with it: leave it that
                        return Err(Unsupported(format!(
                            "fraction_devices {} on a shared request",
                            r.fraction_devices
                        )));
                    }
                    requests.insert(request_obj.as_ptr() as usize, r);
                    r
                }
            };
            let status_obj = attr(&p, intern!(py, "status"))?;
            let status = match statuses.get(&(status_obj.as_ptr() as usize)) {
                Some(s) => *s,
                None => {
                    let value: String = status_obj.extract()?;
                    let s = PodStatus::from_value(&value)
                        .ok_or_else(|| Unsupported(format!("pod status {value:?}")))?;
                    statuses.insert(status_obj.as_ptr() as usize, s);
                    s
                }
            };
            let constraints = match read_constraints(&p)? {
                None => 0,
                Some(c) => {
                    let next = out.constraints.len();
                    let id = *constraint_ids.entry(c.clone()).or_insert(next);
                    if id == next {
                        out.constraints.push(c);
                    }
                    id
                }
            };
            let pod_name = attr(&p, intern!(py, "name"))?;
            let groups_obj = attr(&p, intern!(py, "gpu_groups"))?;
            let gpu_groups = items(&groups_obj)?
                .iter()
                .map(|g| g.extract::<String>())
                .collect::<PyResult<Vec<_>>>()?;
            let pod_namespace = attr(&p, intern!(py, "namespace"))?;
            let task_priority = attr(&p, intern!(py, "task_priority"))?;
            pods.push(Pod {
                name: pod_name.extract()?,
                request,
                status,
                node: opt_string(&p, intern!(py, "node"))?,
                gpu_groups,
                namespace: read_str(&pod_namespace)?,
                task_priority: if task_priority.is_none() {
                    None
                } else {
                    Some(task_priority.extract()?)
                },
                created: float(&p, intern!(py, "created"))?,
                is_ray_head: boolean(&p, intern!(py, "is_ray_head"))?,
                subgroup: opt_string(&p, intern!(py, "subgroup"))?,
                constraints,
                replica: opt_string(&p, intern!(py, "replica"))?,
            });
            names.pod_names.push(pod_name.unbind());
            names.pod_groups.push(groups_obj.unbind());
            names.pod_job.push(job_index);
        }
        out.jobs.push(Job {
            name,
            queue: read_str(&attr(&j, intern!(py, "queue"))?)?,
            priority,
            pods,
            min_member: int(&j, intern!(py, "min_member"))?,
            namespace: read_str(&namespace_obj)?,
            created: float(&j, intern!(py, "created"))?,
            preemptible,
            subgroups,
            stale_since: opt_float(&j, intern!(py, "stale_since"))?,
            last_start: opt_float(&j, intern!(py, "last_start"))?,
            admitted_min_member: opt_int(&j, intern!(py, "admitted_min_member"))?,
        });
        names.job_names.push(name_obj.unbind());
        names.job_namespaces.push(namespace_obj.unbind());
    }
    Ok(names)
}

fn read_config(config: &Bound<'_, PyAny>) -> Conv<SchedulerConfig> {
    let py = config.py();
    let packing = string(config, intern!(py, "gpu_packing"))?;
    // an unknown policy: the Python core says which are known
    let gpu_packing = GpuPacking::from_name(&packing)
        .ok_or_else(|| Unsupported(format!("gpu_packing {packing:?}")))?;
    let placement = attr(config, intern!(py, "placement"))?;
    let spread = |name: &Bound<'_, PyString>| -> Conv<bool> {
        let value = string(&placement, name)?;
        Ok(value == "spread")
    };
    let actions = items(&attr(config, intern!(py, "actions"))?)?
        .iter()
        .map(|a| a.extract::<String>())
        .collect::<PyResult<Vec<_>>>()?;
    Ok(SchedulerConfig {
        gpu_spread: spread(intern!(py, "gpu"))?,
        cpu_spread: spread(intern!(py, "cpu"))?,
        gpu_device_order: opt_string(config, intern!(py, "gpu_device_order"))?,
        gpu_packing,
        actions,
        staleness_grace_period_s: float(config, intern!(py, "staleness_grace_period_s"))?,
        max_consolidation_preemptees: int(config, intern!(py, "max_consolidation_preemptees"))?,
        k_value: float(config, intern!(py, "k_value"))?,
        allow_consolidating_reclaim: boolean(config, intern!(py, "allow_consolidating_reclaim"))?,
        reclaimer_saturation_multiplier: float(
            config,
            intern!(py, "reclaimer_saturation_multiplier"),
        )?,
        default_preempt_min_runtime_s: float(config, intern!(py, "default_preempt_min_runtime_s"))?,
        default_reclaim_min_runtime_s: float(config, intern!(py, "default_reclaim_min_runtime_s"))?,
    })
}

/// The classes of kai_ray/core/result.py the result is built with.
/// (CycleResult, Bind, Pipeline, Evict, JobStatus, NodeFitSummary, QueueShare, PodOutcome)
struct ResultTypes<'py> {
    cycle: Bound<'py, PyAny>,
    bind: Bound<'py, PyAny>,
    pipeline: Bound<'py, PyAny>,
    evict: Bound<'py, PyAny>,
    job_status: Bound<'py, PyAny>,
    fit: Bound<'py, PyAny>,
    queue_share: Bound<'py, PyAny>,
    outcome: Bound<'py, PyAny>,
}

impl<'py> ResultTypes<'py> {
    fn from_tuple(types: &Bound<'py, PyAny>) -> PyResult<ResultTypes<'py>> {
        let t = types.cast::<PyTuple>()?;
        if t.len() != 8 {
            return Err(PyValueError::new_err("types: the eight result classes"));
        }
        Ok(ResultTypes {
            cycle: t.get_item(0)?,
            bind: t.get_item(1)?,
            pipeline: t.get_item(2)?,
            evict: t.get_item(3)?,
            job_status: t.get_item(4)?,
            fit: t.get_item(5)?,
            queue_share: t.get_item(6)?,
            outcome: t.get_item(7)?,
        })
    }
}

fn amounts<'py>(py: Python<'py>, v: &[f64; 3]) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, v)
}

/// One cycle of the native core on `snapshot` (a kai_ray.core.model.Snapshot). Returns the
/// CycleResult, or why not (a string) when the snapshot or config is one it does not take.
#[pyfunction]
#[pyo3(signature = (snapshot, config, now, clock, types))]
fn schedule<'py>(
    py: Python<'py>,
    snapshot: &Bound<'py, PyAny>,
    config: &Bound<'py, PyAny>,
    now: f64,
    clock: &Bound<'py, PyAny>,
    types: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let types = ResultTypes::from_tuple(types)?;
    let read = || -> Conv<(SchedulerConfig, Snapshot, Names, QueueObjects)> {
        let core_config = read_config(config)?;
        let (queues, queue_objects) = read_queues(snapshot)?;
        let mut snap = Snapshot { nodes: read_nodes(snapshot)?, queues, ..Snapshot::default() };
        let names = read_jobs(snapshot, &mut snap)?;
        if core_config.gpu_packing != GpuPacking::Kai {
            // a GPU request packing.PodRequest refuses (the Python raises when it meets one)
            let odd = snap.jobs.iter().flat_map(|j| &j.pods).find(|p| !request_valid(&p.request));
            if let Some(pod) = odd {
                return Err(Unsupported(format!(
                    "pod {:?}: a request the packing policies refuse",
                    pod.name
                )));
            }
        }
        Ok((core_config, snap, names, queue_objects))
    };
    let (core_config, snap, names, queue_objects) = match read() {
        Ok(input) => input,
        Err(Unsupported(why)) => return Ok(PyString::new(py, &why).into_any()),
    };
    // the cycle itself touches no Python object: other threads of the process (the pod
    // grouper, leader election, the webhook) run meanwhile; only the clock, if any, attaches
    let clock: Option<Py<PyAny>> =
        if clock.is_none() { None } else { Some(clock.clone().unbind()) };
    let (out, clock_error) = py.detach(move || {
        let mut clock_error: Option<PyErr> = None;
        let mut tick = || -> Option<f64> {
            let clock = clock.as_ref()?;
            Python::attach(|py| match clock.bind(py).call0().and_then(|v| v.extract::<f64>()) {
                Ok(v) => Some(v),
                Err(e) => {
                    clock_error.get_or_insert(e);
                    None
                }
            })
        };
        let out = kai_ray_core::schedule(snap, core_config, now, &mut tick);
        (out, clock_error)
    });
    if let Some(e) = clock_error {
        return Err(e);
    }
    let out = out.map_err(PyValueError::new_err)?;
    build_result(py, &out, &names, &queue_objects, &types)
}

fn build_result<'py>(
    py: Python<'py>,
    out: &kai_ray_core::CycleOutput,
    names: &Names,
    queue_objects: &QueueObjects,
    types: &ResultTypes<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let node_names: Vec<Bound<'py, PyString>> =
        out.node_names.iter().map(|n| PyString::new(py, n)).collect();
    let node = |n: i32| -> Bound<'py, PyAny> {
        if n >= 0 {
            node_names[n as usize].clone().into_any()
        } else {
            py.None().into_bound(py)
        }
    };
    let gid_names: Vec<Bound<'py, PyString>> =
        out.gids.iter().map(|g| PyString::new(py, g)).collect();
    let groups = |ids: &[u32]| -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, ids.iter().map(|&g| gid_names[g as usize].clone()))
    };
    let statuses: Vec<Bound<'py, PyString>> =
        PodStatus::ALL.iter().map(|s| PyString::intern(py, s.value())).collect();
    let status =
        |s: PodStatus| statuses[PodStatus::ALL.iter().position(|x| *x == s).unwrap_or(0)].clone();
    let job_of = |task: usize| names.pod_job[task];

    let result = types.cycle.call0()?;
    let pods = PyDict::new(py);
    for (i, outcome) in out.pods.iter().enumerate() {
        // a pod keeps its own device-id tuple when its devices did not change
        let gpu_groups = match &outcome.groups {
            None => names.pod_groups[i].bind(py).clone(),
            Some(ids) => groups(ids)?.into_any(),
        };
        let value =
            types.outcome.call1((status(outcome.status), node(outcome.node), gpu_groups))?;
        pods.set_item(names.pod_names[i].bind(py), value)?;
    }
    result.setattr(intern!(py, "pods"), pods)?;

    let binds = PyList::empty(py);
    for b in &out.binds {
        let j = job_of(b.task);
        binds.append(types.bind.call1((
            names.job_names[j].bind(py),
            names.job_namespaces[j].bind(py),
            names.pod_names[b.task].bind(py),
            node(b.node),
            groups(&b.groups)?,
            groups(&b.new_groups)?,
            b.portion,
            b.gpu_memory_mib,
        ))?)?;
    }
    result.setattr(intern!(py, "binds"), binds)?;

    let pipelined = PyList::empty(py);
    for &(task, n) in &out.pipelined {
        let j = job_of(task);
        pipelined.append(types.pipeline.call1((
            names.job_names[j].bind(py),
            names.job_namespaces[j].bind(py),
            names.pod_names[task].bind(py),
            node(n),
            intern!(py, "pipeline"),
        ))?)?;
    }
    result.setattr(intern!(py, "pipelined"), pipelined)?;

    let evictions = PyList::empty(py);
    for e in &out.evictions {
        let j = job_of(e.task);
        let preemptor = match e.preemptor {
            Some(p) => names.job_names[p].bind(py).clone(),
            None => py.None().into_bound(py),
        };
        evictions.append(types.evict.call1((
            names.job_names[j].bind(py),
            names.job_namespaces[j].bind(py),
            names.pod_names[e.task].bind(py),
            node(e.node),
            e.action,
            e.message.as_str(),
            preemptor,
        ))?)?;
    }
    result.setattr(intern!(py, "evictions"), evictions)?;

    let job_status = PyDict::new(py);
    for s in &out.job_status {
        let fit = match &s.fit {
            Some(reasons) => {
                let pairs = PyTuple::new(
                    py,
                    reasons
                        .iter()
                        .map(|(r, c)| {
                            PyTuple::new(
                                py,
                                [
                                    r.as_str().into_pyobject(py)?.into_any(),
                                    c.into_pyobject(py)?.into_any(),
                                ],
                            )
                        })
                        .collect::<PyResult<Vec<_>>>()?,
                )?;
                types.fit.call1((pairs,))?
            }
            None => py.None().into_bound(py),
        };
        let pending = PyTuple::new(py, s.pending.iter().map(|&t| names.pod_names[t].bind(py)))?;
        let name = names.job_names[s.job].bind(py);
        job_status.set_item(
            name,
            types.job_status.call1((
                name,
                names.job_namespaces[s.job].bind(py),
                s.reason.as_str(),
                s.message.as_str(),
                pending,
                fit,
            ))?,
        )?;
    }
    result.setattr(intern!(py, "job_status"), job_status)?;

    let stale_set = PyDict::new(py);
    for &(job, at) in &out.stale_set {
        stale_set.set_item(names.job_names[job].bind(py), at)?;
    }
    result.setattr(intern!(py, "stale_set"), stale_set)?;
    let stale_cleared =
        PyList::new(py, out.stale_cleared.iter().map(|&j| names.job_names[j].bind(py)))?;
    result.setattr(intern!(py, "stale_cleared"), stale_cleared)?;

    let queues = PyDict::new(py);
    for q in &out.queues {
        let name = out.queue_names[q.queue].as_str();
        // quota and limit as the Queue gives them (an int stays an int), memory's in bytes
        let given = queue_objects[name].bind(py);
        let (gpu, cpu) = (given.getattr(intern!(py, "gpu"))?, given.getattr(intern!(py, "cpu"))?);
        let as_given = |field: &Bound<'py, PyString>,
                        memory: f64|
         -> PyResult<Bound<'py, PyTuple>> {
            PyTuple::new(
                py,
                [cpu.getattr(field)?, memory.into_pyobject(py)?.into_any(), gpu.getattr(field)?],
            )
        };
        queues.set_item(
            name,
            types.queue_share.call1((
                name,
                out.queue_parents[q.queue].as_deref(),
                as_given(intern!(py, "quota"), q.deserved[1])?,
                as_given(intern!(py, "limit"), q.limit[1])?,
                amounts(py, &q.fair_share)?,
                amounts(py, &q.allocated)?,
                amounts(py, &q.allocated_np)?,
                amounts(py, &q.requested)?,
            ))?,
        )?;
    }
    result.setattr(intern!(py, "queues"), queues)?;

    let seconds = PyDict::new(py);
    for (action, s) in &out.action_seconds {
        seconds.set_item(action.as_str(), *s)?;
    }
    result.setattr(intern!(py, "action_seconds"), seconds)?;
    Ok(result)
}

#[pymodule]
fn kai_ray_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(schedule, m)?)?;
    // the calling convention (kai_ray.core.schedule.NATIVE_ABI must match)
    m.add("ABI", 1)?;
    m.add("__doc__", "kai-ray's scheduling core in Rust (see native/ in the repository)")?;
    Ok(())
}
