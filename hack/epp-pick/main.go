// epp-pick asks an endpoint picker (the Gateway API Inference Extension's EPP) where a chat
// request for a model goes, as a gateway's ext_proc filter does: the request's headers, then
// its body, over one Process stream; it prints the endpoint the picker chose (IP:port) from
// the x-gateway-destination-endpoint header it sets. The cluster tier uses it in place of a
// gateway (tests/cluster/test_inference_pool.py); hack/k8s-env.sh builds it with the picker.
//
//	epp-pick ADDRESS MODEL
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

const destination = "x-gateway-destination-endpoint"

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: epp-pick ADDRESS MODEL")
		os.Exit(2)
	}
	endpoint, err := pick(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "epp-pick:", err)
		os.Exit(1)
	}
	fmt.Println(endpoint)
}

func header(key, value string) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: key, RawValue: []byte(value)}
}

func pick(address, model string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The picker serves TLS with a self-signed certificate unless given one (its default).
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(creds))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(map[string]any{
		"model":    model,
		"messages": []map[string]string{{"role": "user", "content": "hi"}},
	})
	if err != nil {
		return "", err
	}
	headers := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		header(":method", "POST"),
		header(":path", "/v1/chat/completions"),
		header(":authority", "gateway"),
		header("content-type", "application/json"),
	}}}
	if err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers},
	}); err != nil {
		return "", err
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true},
		},
	}); err != nil {
		return "", err
	}
	for {
		response, err := stream.Recv()
		if err != nil {
			return "", err
		}
		if immediate := response.GetImmediateResponse(); immediate != nil {
			return "", fmt.Errorf("the picker answered itself: %d %s",
				immediate.GetStatus().GetCode(), immediate.GetBody())
		}
		mutation := response.GetRequestHeaders().GetResponse().GetHeaderMutation()
		for _, set := range mutation.GetSetHeaders() {
			if set.GetHeader().GetKey() == destination {
				return string(set.GetHeader().GetRawValue()), nil
			}
		}
	}
}
