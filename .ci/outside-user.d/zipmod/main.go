// Command zipmod serves modules from a file-based module proxy, as an
// outside user's go command would fetch them from a published tag: for
// each module directory given, it writes list, <version>.info,
// <version>.mod and <version>.zip under <proxy>/<escaped module path>/@v/.
//
//	go run . -proxy DIR -version v0.1.0 -time 2026-12-02T00:00:00Z MODDIR...
//
// The zips are made by golang.org/x/mod/zip, which applies the go
// command's own rules (nested modules left out, file names checked), so a
// module that this accepts is one the go command could publish.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("zipmod: ")
	proxy := flag.String("proxy", "", "proxy directory to write into")
	version := flag.String("version", "", "version to serve each module at")
	stamp := flag.String("time", "", "the version's time, RFC 3339 (the commit's)")
	flag.Parse()
	if *proxy == "" || *version == "" || flag.NArg() == 0 {
		log.Fatal("usage: zipmod -proxy DIR -version VERSION [-time RFC3339] MODDIR...")
	}
	at := time.Now().UTC()
	if *stamp != "" {
		t, err := time.Parse(time.RFC3339, *stamp)
		if err != nil {
			log.Fatalf("-time: %v", err)
		}
		at = t.UTC()
	}
	for _, dir := range flag.Args() {
		path, err := serve(*proxy, *version, at, dir)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s@%s from %s\n", path, *version, dir)
	}
}

// serve writes the module in dir into the proxy at version and returns
// its module path.
func serve(proxy, version string, at time.Time, dir string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return "", fmt.Errorf("%s/go.mod names no module", dir)
	}
	m := module.Version{Path: path, Version: version}
	if err := module.Check(m.Path, m.Version); err != nil {
		return "", err
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, at})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	f, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return "", err
	}
	if err := zip.CreateFromDir(f, m, dir); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}
