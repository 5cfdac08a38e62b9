"""kai_ray.testing: a real local Kubernetes control plane for tests and `kai-ray dev-cluster`.

- binaries: where tools/cluster/build.sh put etcd, kube-*, kwok, ray-operator, kubectl, helm
- plane.ControlPlane: etcd + kube-apiserver + kube-controller-manager + KWOK on loopback
- cluster.Cluster: the same client-side helpers for any kubeconfig (kind, a real cluster)
- nodes: KWOK GPU nodes; kwok-stages.yaml: how KWOK moves nodes and pods along
- kuberay: the real KubeRay operator (--batch-scheduler=kai-scheduler) and its CRDs
- devcluster: the `kai-ray dev-cluster` command
"""
