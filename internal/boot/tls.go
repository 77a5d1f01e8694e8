package boot

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLS is a link's transport security, the same for every link. It is on
// when Enabled is set or any file or the server name is: an empty TLS
// section means plain TCP.
type TLS struct {
	// Enabled turns TLS on with the system's CAs when nothing else is set
	// (a managed service with a public certificate).
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs that may sign the server's
	// certificate; empty: the system's.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// servers that ask for one; both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the server's certificate must carry; default
	// the host of the address dialled.
	ServerName string `yaml:"server_name"`
	// MinVersion is "1.2" (default) or "1.3".
	MinVersion string `yaml:"min_version"`
}

// On reports whether the link uses TLS.
func (t TLS) On() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// applyEnv overrides t from PREFIX_TLS (true/false), PREFIX_TLS_CA_FILE,
// _TLS_CERT_FILE, _TLS_KEY_FILE, _TLS_SERVER_NAME and _TLS_MIN_VERSION.
func (t *TLS) applyEnv(e *Env, prefix string) {
	e.Bool(&t.Enabled, prefix+"_TLS")
	e.String(&t.CAFile, prefix+"_TLS_CA_FILE")
	e.String(&t.CertFile, prefix+"_TLS_CERT_FILE")
	e.String(&t.KeyFile, prefix+"_TLS_KEY_FILE")
	e.String(&t.ServerName, prefix+"_TLS_SERVER_NAME")
	e.String(&t.MinVersion, prefix+"_TLS_MIN_VERSION")
}

// validate joins every problem with t, named after the YAML section
// (such as "redis.tls"). It reads the files, so a missing CA or a key that
// does not match its certificate is a configuration error, found by
// -check, not at the first connection.
func (t TLS) validate(section string) error {
	if !t.On() {
		return nil
	}
	_, err := t.Config()
	if err != nil {
		return fmt.Errorf("%s: %w", section, err)
	}
	return nil
}

// Config is the crypto/tls configuration for t, nil when TLS is off.
// Clients set the server name from the address they dial when ServerName
// is empty (go-redis, franz-go and clickhouse-go all do).
func (t TLS) Config() (*tls.Config, error) {
	if !t.On() {
		return nil, nil
	}
	c := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	switch t.MinVersion {
	case "", "1.2":
	case "1.3":
		c.MinVersion = tls.VersionTLS13
	default:
		return nil, fmt.Errorf("min_version %q: want 1.2 or 1.3", t.MinVersion)
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("cert_file and key_file go together")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
