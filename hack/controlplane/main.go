// Command controlplane starts a real Kubernetes control plane on loopback for the
// gpuslice end-to-end tests: an embedded etcd, kube-apiserver and kube-scheduler,
// all built from the published Go modules of one Kubernetes release.
//
// Usage:
//
//	controlplane [--dir DIR] [--scheduler-config FILE] [--apiserver-arg=--flag=value ...]
//	             [--controllers=NAME,...] [--controller-manager-arg=--flag=value ...]
//
// When everything answers, it prints exactly one line on stdout:
//
//	GPUSLICE_CONTROLPLANE_READY {"kubeconfig": ..., "server": ..., "token": ..., ...}
//
// and keeps running until SIGTERM or SIGINT, when it stops the scheduler, the API server
// and etcd, in that order, and exits 0. If any part dies on its own, it stops the rest and
// exits 1, so a test fixture sees the failure instead of hanging.
//
// The API server and the scheduler run as child processes of this same binary
// (`controlplane kube-apiserver ...`, `controlplane kube-scheduler ...`) rather than in
// one process: both register global flags, feature gates and metrics, and keeping them
// apart is how they run in a real cluster.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanagerapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	"sigs.k8s.io/yaml"
)

// readyPrefix starts the one stdout line the test fixtures wait for.
const readyPrefix = "GPUSLICE_CONTROLPLANE_READY "

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	// Invoked as hack/bin/kubectl (a link to this binary): the kubectl of the same release, so
	// the tests need no kubectl on the machine and never talk to a server with a skewed client.
	if filepath.Base(os.Args[0]) == "kubectl" {
		// As k8s.io/kubernetes/cmd/kubectl does.
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err) // prints the error as kubectl does, exits non-zero
		}
		os.Exit(0)
	}
	// Child modes: run one upstream component with the given arguments.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "kube-apiserver":
			cmd := apiserverapp.NewAPIServerCommand()
			cmd.SetArgs(os.Args[2:])
			os.Exit(cli.Run(cmd))
		case "kube-scheduler":
			cmd := schedulerapp.NewSchedulerCommand()
			cmd.SetArgs(os.Args[2:])
			os.Exit(cli.Run(cmd))
		case "kube-controller-manager":
			cmd := controllermanagerapp.NewControllerManagerCommand()
			cmd.SetArgs(os.Args[2:])
			os.Exit(cli.Run(cmd))
		}
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	dir             string
	schedulerConfig string
	apiserverArgs   multiFlag
	schedulerArgs   multiFlag
	controllers     string
	cmArgs          multiFlag
	startTimeout    time.Duration
}

func run() error {
	var o options
	fs := flag.NewFlagSet("controlplane", flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", "", "state directory (certs, kubeconfig, etcd data, logs); a temporary one, removed on exit, when empty")
	fs.StringVar(&o.schedulerConfig, "scheduler-config", "", "KubeSchedulerConfiguration file (e.g. with extenders); clientConnection.kubeconfig is filled in")
	fs.Var(&o.apiserverArgs, "apiserver-arg", "extra kube-apiserver flag, repeatable (e.g. --apiserver-arg=--v=4)")
	fs.Var(&o.schedulerArgs, "scheduler-arg", "extra kube-scheduler flag, repeatable")
	fs.StringVar(&o.controllers, "controllers", "", "also run kube-controller-manager with only these controllers (e.g. resourceclaim-controller); none when empty")
	fs.Var(&o.cmArgs, "controller-manager-arg", "extra kube-controller-manager flag, repeatable")
	fs.DurationVar(&o.startTimeout, "start-timeout", 3*time.Minute, "how long to wait for every part to answer")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	removeDir := false
	if o.dir == "" {
		d, err := os.MkdirTemp("", "gpuslice-controlplane-")
		if err != nil {
			return err
		}
		o.dir, removeDir = d, true
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if removeDir {
		defer os.RemoveAll(dir)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	creds, err := writeCredentials(dir)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}

	// etcd, in process. No fsync: the data only lives as long as one test session.
	etcdClient, etcdPeer, apiPort, schedPort := freePort(), freePort(), freePort(), freePort()
	ecfg := embed.NewConfig()
	ecfg.Name = "gpuslice-e2e"
	ecfg.Dir = filepath.Join(dir, "etcd")
	ecfg.UnsafeNoFsync = true
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", etcdClient))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", etcdPeer))
	ecfg.ListenClientUrls, ecfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ecfg.ListenPeerUrls, ecfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ecfg.InitialCluster = fmt.Sprintf("%s=%s", ecfg.Name, pu.String())
	ecfg.LogLevel = "error"
	ecfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	etcd, err := embed.StartEtcd(ecfg)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return errors.New("etcd did not become ready in 60s")
	case <-ctx.Done():
		return nil
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	died := make(chan string, 3)

	apiArgs := []string{
		"--etcd-servers=" + cu.String(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The "kubernetes" Service endpoints may not point at loopback, and nothing in the
		// tests runs in a pod that would use them.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--tls-cert-file=" + creds.servingCert,
		"--tls-private-key-file=" + creds.servingKey,
		"--client-ca-file=" + creds.caCert,
		"--token-auth-file=" + creds.tokenFile,
		"--service-account-key-file=" + creds.saPub,
		"--service-account-signing-key-file=" + creds.saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		// Webhooks are what the tests exercise; ServiceAccount admission is off because
		// there is no controller-manager here to create each namespace's "default"
		// ServiceAccount, and pods would be refused for want of it.
		"--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
		"--disable-admission-plugins=ServiceAccount",
		// Hundreds of pods are created at once by the tests; the defaults (400/200
		// in flight plus priority-and-fairness queues) would answer some with 429.
		"--max-requests-inflight=3000",
		"--max-mutating-requests-inflight=1500",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}
	apiArgs = append(apiArgs, o.apiserverArgs...)
	apiCmd, err := startChild(self, "kube-apiserver", apiArgs, filepath.Join(dir, "kube-apiserver.log"), died)
	if err != nil {
		return err
	}
	defer stopChild(apiCmd, 30*time.Second)

	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	if err := waitHTTP(ctx, died, server+"/readyz", creds.token, o.startTimeout); err != nil {
		return fmt.Errorf("kube-apiserver: %w (log: %s)", err, tail(filepath.Join(dir, "kube-apiserver.log")))
	}
	// /readyz can pass a moment before the system namespaces exist; pods go into "default".
	if err := waitHTTP(ctx, died, server+"/api/v1/namespaces/default", creds.token, o.startTimeout); err != nil {
		return fmt.Errorf("kube-apiserver: namespace default: %w", err)
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, server, creds); err != nil {
		return err
	}

	schedCfg, err := schedulerConfig(dir, o.schedulerConfig, kubeconfig)
	if err != nil {
		return fmt.Errorf("scheduler config: %w", err)
	}
	schedArgs := []string{
		"--config=" + schedCfg,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(schedPort),
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--cert-dir=" + filepath.Join(dir, "scheduler-certs"),
		"--v=2",
	}
	schedArgs = append(schedArgs, o.schedulerArgs...)
	schedCmd, err := startChild(self, "kube-scheduler", schedArgs, filepath.Join(dir, "kube-scheduler.log"), died)
	if err != nil {
		return err
	}
	defer stopChild(schedCmd, 15*time.Second)
	schedHealth := fmt.Sprintf("https://127.0.0.1:%d/healthz", schedPort)
	if err := waitHTTP(ctx, died, schedHealth, "", o.startTimeout); err != nil {
		return fmt.Errorf("kube-scheduler: %w (log: %s)", err, tail(filepath.Join(dir, "kube-scheduler.log")))
	}

	cmLog := ""
	if o.controllers != "" {
		cmPort := freePort()
		cmLog = filepath.Join(dir, "kube-controller-manager.log")
		cmArgs := []string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--controllers=" + o.controllers,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(cmPort),
			"--cert-dir=" + filepath.Join(dir, "controller-manager-certs"),
			// Controllers act with the admin credentials of the kubeconfig: there is no token
			// controller here to mint per-controller service-account tokens.
			"--use-service-account-credentials=false",
			"--kube-api-qps=500",
			"--kube-api-burst=1000",
			"--v=1",
		}
		cmArgs = append(cmArgs, o.cmArgs...)
		cmCmd, err := startChild(self, "kube-controller-manager", cmArgs, cmLog, died)
		if err != nil {
			return err
		}
		defer stopChild(cmCmd, 15*time.Second)
		if err := waitHTTP(ctx, died, fmt.Sprintf("https://127.0.0.1:%d/healthz", cmPort), "", o.startTimeout); err != nil {
			return fmt.Errorf("kube-controller-manager: %w (log: %s)", err, tail(cmLog))
		}
	}

	ready, _ := json.Marshal(map[string]any{
		"kubeconfig":             kubeconfig,
		"server":                 server,
		"token":                  creds.token,
		"ca_file":                creds.caCert,
		"client_cert_file":       creds.clientCert,
		"client_key_file":        creds.clientKey,
		"etcd":                   cu.String(),
		"scheduler_config":       schedCfg,
		"scheduler_health":       schedHealth,
		"dir":                    dir,
		"pid":                    os.Getpid(),
		"apiserver_log":          filepath.Join(dir, "kube-apiserver.log"),
		"scheduler_log":          filepath.Join(dir, "kube-scheduler.log"),
		"controller_manager_log": cmLog,
	})
	fmt.Println(readyPrefix + string(ready))

	select {
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "controlplane: stopping")
		return nil // deferred stops run: scheduler, apiserver, etcd
	case who := <-died:
		return fmt.Errorf("%s exited on its own; see its log in %s", who, dir)
	}
}

// freePort asks the kernel for an unused loopback port. Another process could take it
// before the component binds it; on loopback in a test that race is rare and it shows
// as a clear "address in use" start failure, not as a wrong result.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startChild(self, name string, args []string, logPath string, died chan<- string) (*exec.Cmd, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If this process is killed with SIGKILL, its children must not outlive it and
	// keep ports and etcd connections around between test runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		died <- name
	}()
	return cmd, nil
}

func stopChild(cmd *exec.Cmd, grace time.Duration) {
	if cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		// Signal 0 fails once the process is gone (reaped by the Wait goroutine).
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
}

func waitHTTP(ctx context.Context, died <-chan string, u, token string, timeout time.Duration) error {
	client := &http.Client{
		Timeout: 5 * time.Second,
		// The serving certs are checked by the clients the tests use (kubeconfig with the
		// CA); this loop only asks "does it answer 200 yet".
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case who := <-died:
			return fmt.Errorf("%s exited while starting", who)
		case <-ctx.Done():
			return errors.New("interrupted")
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %s", u, timeout, last)
}

// schedulerConfig copies the test's KubeSchedulerConfiguration, pointing it at this
// control plane, and turns off leader election (one scheduler, restarted by tests)
// unless the file says otherwise.
func schedulerConfig(dir, src, kubeconfig string) (string, error) {
	cfg := map[string]any{
		"apiVersion": "kubescheduler.config.k8s.io/v1",
		"kind":       "KubeSchedulerConfiguration",
	}
	if src != "" {
		raw, err := os.ReadFile(src)
		if err != nil {
			return "", err
		}
		cfg = map[string]any{}
		if err := yaml.Unmarshal(raw, &cfg); err != nil {
			return "", fmt.Errorf("%s: %w", src, err)
		}
	}
	cc, _ := cfg["clientConnection"].(map[string]any)
	if cc == nil {
		cc = map[string]any{}
	}
	cc["kubeconfig"] = kubeconfig
	// Default 50 QPS would make the scheduler, not our extender, the bottleneck of
	// tests that place hundreds of pods.
	if _, ok := cc["qps"]; !ok {
		cc["qps"] = 500
	}
	if _, ok := cc["burst"]; !ok {
		cc["burst"] = 1000
	}
	cfg["clientConnection"] = cc
	le, _ := cfg["leaderElection"].(map[string]any)
	if le == nil {
		le = map[string]any{"leaderElect": false}
	}
	cfg["leaderElection"] = le
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "scheduler-config.yaml")
	return path, os.WriteFile(path, out, 0o600)
}

func writeKubeconfig(path, server string, c *credentials) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: gpuslice-e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: gpuslice-e2e
  context:
    cluster: gpuslice-e2e
    user: admin
current-context: gpuslice-e2e
`, server, c.caCert, c.clientCert, c.clientKey)
	return os.WriteFile(path, []byte(kc), 0o600)
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
