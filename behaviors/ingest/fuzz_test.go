package ingest_test

import (
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/stinthq/stint/behaviors/ingest"
)

// FuzzParseManifest feeds arbitrary text to the manifest parser: it either
// fails with an error naming a line, or returns objects whose every file
// has an allowed URL scheme and a complete digest.
func FuzzParseManifest(f *testing.F) {
	for _, seed := range []string{
		"http://example.com/a.txt | md5 | 0cc175b9c0f1b6a831c399e269772661 | 1 | a.txt\n",
		"#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileName\nhttps://x/y | sha256 | " + strings.Repeat("0", 64) + " | 2 | y\n",
		"file:///tmp/x | | | | x | obj-1\nfile:///tmp/y | | | | y | obj-1\n",
		"ftp://nope/x\n", "http://x | crc | 1\n", "# comment only\n", "|||||\n", "http://x | md5\n",
		"http://x | sha1 | zz | -5 | ../../etc/passwd\n", "\x00\xff\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		objs, err := ingest.ParseManifest(text)
		if err != nil {
			return
		}
		for _, o := range objs {
			if len(o.Files) == 0 {
				t.Fatalf("object without files from %q", text)
			}
			for _, file := range o.Files {
				u, err := url.Parse(file.URL)
				if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") {
					t.Fatalf("accepted URL %q from %q", file.URL, text)
				}
				if (file.DigestAlg == "") != (file.Digest == "") {
					t.Fatalf("half a digest accepted from %q: %+v", text, file)
				}
				if clean := path.Clean("/" + file.Name); file.Name == "" || clean != "/"+file.Name || strings.Contains(file.Name, "\x00") {
					t.Fatalf("file name %q accepted from %q: it is empty or escapes the object", file.Name, text)
				}
				if file.Size != nil && *file.Size < 0 {
					t.Fatalf("negative size accepted from %q", text)
				}
			}
		}
	})
}
