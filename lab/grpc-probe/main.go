// grpc-probe dials a CSI plugin's unix socket the way kubelet and the CSI sidecars do (Go
// gRPC) and prints one JSON object: GetPluginInfo, Probe, and a call that must fail.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// result is one RPC's outcome; code is the gRPC status name ("OK", "Unimplemented", ...).
type result struct {
	Code     string         `json:"code"`
	Message  string         `json:"message,omitempty"`
	Response map[string]any `json:"response,omitempty"`
}

func outcome(resp map[string]any, err error) result {
	if err != nil {
		s, _ := status.FromError(err)
		return result{Code: s.Code().String(), Message: s.Message()}
	}
	return result{Code: "OK", Response: resp}
}

func main() {
	addr := flag.String("addr", "", "target, e.g. unix:///run/csi/csi.sock")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of each call")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "usage: grpc-probe -addr unix:///path/to.sock")
		os.Exit(2)
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	identity := csi.NewIdentityClient(conn)
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), *timeout) }

	out := map[string]result{}

	ctx, cancel := call()
	info, err := identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	cancel()
	var infoResp map[string]any
	if err == nil {
		infoResp = map[string]any{"name": info.GetName(), "vendorVersion": info.GetVendorVersion(), "manifest": info.GetManifest()}
	}
	out["getPluginInfo"] = outcome(infoResp, err)

	ctx, cancel = call()
	probe, err := identity.Probe(ctx, &csi.ProbeRequest{})
	cancel()
	var probeResp map[string]any
	if err == nil {
		probeResp = map[string]any{"ready": nil}
		if probe.GetReady() != nil {
			probeResp["ready"] = probe.GetReady().GetValue()
		}
	}
	out["probe"] = outcome(probeResp, err)

	// Deliberately failing: an identity-only server has no Controller service, so this must come
	// back UNIMPLEMENTED with a message. The secret must not show up in the server's log.
	ctx, cancel = call()
	_, err = csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:    "probe-volume",
		Secrets: map[string]string{"password": "grpc-probe-secret"},
	})
	cancel()
	if err == nil {
		out["failing"] = result{Code: "OK", Message: "expected an error, got success"}
	} else {
		out["failing"] = outcome(nil, err)
	}

	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "encode:", err)
		os.Exit(1)
	}
}
