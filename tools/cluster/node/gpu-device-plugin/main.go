// A fake NVIDIA GPU device plugin for the local real node: a real kubelet device plugin (the
// v1beta1 gRPC API) that advertises N `nvidia.com/gpu` devices which do not exist.
//
// It behaves as NVIDIA's k8s-device-plugin does towards the kubelet and the pod: the device IDs
// are GPU UUIDs, and Allocate answers NVIDIA_VISIBLE_DEVICES=<the allocated UUIDs>, so a program
// in the pod discovers "its" GPUs exactly as on a GPU node. Only the hardware is fake.
//
// The UUIDs are stable (derived from the node name and the index), so a restarted plugin
// advertises the same devices and the kubelet's checkpointed allocations stay valid.
//
// The kubelet removes every socket in its device-plugin directory when it (re)starts; the plugin
// notices its socket is gone and serves and registers again.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	stop    chan struct{} // closed when this server instance is replaced or shut down
}

// fakeUUID is shaped like nvidia-smi's GPU UUIDs: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func fakeUUID(node string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("kai-ray-fake-gpu/%s/%d", node, index)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the (always healthy) device list once, then holds the stream open: the
// kubelet treats a closed stream as the plugin gone.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-s.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := strings.Join(c.DevicesIds, ",")
		log.Printf("allocate %s", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": ids},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// serve starts a gRPC server on socket (replacing a stale file) and waits until it answers.
func serve(p *plugin, socket string) (*grpc.Server, error) {
	_ = os.Remove(socket)
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}

// register tells the kubelet (on its registration socket) about our endpoint and resource.
func register(kubeletSocket, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func main() {
	hostname, _ := os.Hostname()
	gpus := flag.Int("gpus", 2, "number of fake GPUs to advertise")
	node := flag.String("node-name", hostname, "node name the fake GPU UUIDs derive from")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	endpoint := flag.String("endpoint", "kai-ray-fake-gpu.sock", "socket file name in -plugin-dir")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	devices := make([]*pluginapi.Device, *gpus)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: fakeUUID(*node, i), Health: pluginapi.Healthy}
	}
	socket := filepath.Join(*dir, *endpoint)
	kubeletSocket := filepath.Join(*dir, "kubelet.sock")

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	var srv *grpc.Server
	var current *plugin
	shutdown := func() {
		if srv != nil {
			close(current.stop)
			srv.Stop()
			srv = nil
		}
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		// (Re)start and (re)register when our socket is missing: first run, or the kubelet
		// restarted and cleared the directory. Wait for the kubelet's socket before that.
		if (srv == nil || !exists(socket)) && exists(kubeletSocket) {
			shutdown()
			current = &plugin{devices: devices, stop: make(chan struct{})}
			var err error
			if srv, err = serve(current, socket); err != nil {
				log.Printf("serve %s: %v", socket, err)
			} else if err = register(kubeletSocket, *endpoint, *resource); err != nil {
				log.Printf("register with %s: %v (retrying)", kubeletSocket, err)
				shutdown()
			} else {
				ids := make([]string, len(devices))
				for i, d := range devices {
					ids[i] = d.ID
				}
				log.Printf("registered %d x %s: %s", len(devices), *resource, strings.Join(ids, ","))
			}
		}
		select {
		case <-sigs:
			shutdown()
			_ = os.Remove(socket)
			return
		case <-tick.C:
		}
	}
}
