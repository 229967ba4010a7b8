// Command e2e-image writes the end-to-end test's image as a tarball that
// `ctr images import` reads: one layer holding a static binary as /workload,
// and the environment of a CUDA base image (NVIDIA_VISIBLE_DEVICES=all) plus
// values a user might set to escape Tessera's limits, which the node agent
// must override.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	binary := flag.String("binary", "", "the static binary to run as /workload")
	out := flag.String("o", "e2e-image.tar", "the tarball to write")
	tag := flag.String("tag", "docker.io/tessera/e2e-workload:v1", "the image's name")
	flag.Parse()
	if err := write(*binary, *out, *tag); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-image:", err)
		os.Exit(1)
	}
}

func write(binary, out, tag string) error {
	content, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{Name: "workload", Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(content); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config = v1.Config{
		Entrypoint: []string{"/workload"},
		Env: []string{
			"PATH=/",
			"NVIDIA_VISIBLE_DEVICES=all",
			"NVIDIA_DRIVER_CAPABILITIES=compute,utility",
			"CUDA_DEVICE_MEMORY_LIMIT_0=1000000m",
			"CUDA_TASK_PRIORITY=0",
		},
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}
