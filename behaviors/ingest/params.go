package ingest

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/stinthq/stint/api"
)

// BatchParams are the params of ingest.batch: a depositor's submission.
// Exactly one of PayloadURL and Manifest is given. They are checked when the
// JSON is decoded, so that a bad submission is refused by Submit (an
// *api.InvalidError) before anything is stored.
type BatchParams struct {
	// Submitter names the depositor. Required.
	Submitter string `json:"submitter" validate:"required,max=256"`
	// Profile names the collection: the group key of the batch and its
	// jobs (the scope of collection holds and per-collection limits), and
	// the key of the profile's settings such as the callback URL.
	// Required; 1 to 128 characters from A-Z a-z 0-9 . _ -.
	Profile string `json:"profile" validate:"required,max=128"`
	// PayloadURL is a single file to ingest as one object (http, https or
	// file URL).
	PayloadURL string `json:"payload_url,omitempty"`
	// Manifest is a checkm-style manifest, one file a line (see
	// ParseManifest); files with the same local identifier form one object.
	Manifest string `json:"manifest,omitempty"`
	// Title, Creator and Date describe the objects (ERC what, who, when).
	Title   string `json:"title,omitempty" validate:"max=1000"`
	Creator string `json:"creator,omitempty" validate:"max=1000"`
	Date    string `json:"date,omitempty" validate:"max=100"`
	// Priority is the priority of the batch's jobs, 0 to 32767, lower
	// first; nil takes the default, 5.
	Priority *int `json:"priority,omitempty" validate:"omitempty,gte=0,lte=32767"`

	objects []Object
}

// Objects returns the objects of the submission, parsed from PayloadURL or
// Manifest when the params were decoded from JSON.
func (p BatchParams) Objects() []Object { return p.objects }

// UnmarshalJSON decodes the params strictly (unknown fields are errors) and
// checks the payload: URL schemes, manifest syntax (with line numbers) and
// digest algorithms.
func (p *BatchParams) UnmarshalJSON(b []byte) error {
	type plain BatchParams
	var v plain
	if err := strictDecode(b, &v); err != nil {
		return err
	}
	*p = BatchParams(v)
	if !profilePattern.MatchString(p.Profile) {
		return fmt.Errorf("profile %q: want 1 to 128 characters from A-Z a-z 0-9 . _ -", truncate(p.Profile))
	}
	switch {
	case p.PayloadURL != "" && p.Manifest != "":
		return errors.New("payload_url and manifest: give one of them, not both")
	case p.PayloadURL != "":
		f := File{URL: p.PayloadURL}
		if err := f.check(); err != nil {
			return fmt.Errorf("payload_url: %w", err)
		}
		p.objects = []Object{{Files: []File{f}}}
	case strings.TrimSpace(p.Manifest) != "":
		objs, err := ParseManifest(p.Manifest)
		if err != nil {
			return err
		}
		p.objects = objs
	default:
		return errors.New("payload_url or manifest: one of them is required")
	}
	return nil
}

// JobParams are the params of ingest.job: one object of a batch.
type JobParams struct {
	// BatchID is the batch the job belongs to.
	BatchID api.TaskID `json:"batch_id" validate:"required,max=128"`
	// Index is the object's position in the batch, from 0.
	Index int `json:"index" validate:"gte=0"`
	// Profile is the batch's profile (collection).
	Profile   string `json:"profile" validate:"required,max=128"`
	Submitter string `json:"submitter" validate:"required,max=256"`
	Title     string `json:"title,omitempty" validate:"max=1000"`
	Creator   string `json:"creator,omitempty" validate:"max=1000"`
	Date      string `json:"date,omitempty" validate:"max=100"`
	// Object is what the job ingests.
	Object Object `json:"object"`
}

// UnmarshalJSON decodes the params strictly and checks the object.
func (p *JobParams) UnmarshalJSON(b []byte) error {
	type plain JobParams
	var v plain
	if err := strictDecode(b, &v); err != nil {
		return err
	}
	*p = JobParams(v)
	if !profilePattern.MatchString(p.Profile) {
		return fmt.Errorf("profile %q: want 1 to 128 characters from A-Z a-z 0-9 . _ -", truncate(p.Profile))
	}
	return p.Object.check()
}

// Object is one object of a submission: its files and identifiers.
type Object struct {
	// LocalID is the depositor's identifier of the object.
	LocalID string `json:"local_id,omitempty"`
	// Identifier is the object's primary identifier; empty to mint one.
	Identifier string `json:"identifier,omitempty"`
	// Files are the object's files, at least one.
	Files []File `json:"files"`
}

// File is one file of an object.
type File struct {
	// URL is where the file is fetched from: http, https or file.
	URL string `json:"url"`
	// Name is the file's path inside the object. Defaults to the last
	// segment of the URL's path.
	Name string `json:"name,omitempty"`
	// DigestAlg and Digest are the file's expected digest: md5, sha1,
	// sha256 or sha512, in hex. Both or neither.
	DigestAlg string `json:"digest_alg,omitempty"`
	Digest    string `json:"digest,omitempty"`
	// Size is the expected size in bytes, if known.
	Size *int64 `json:"size,omitempty"`
}

// Limits of a submission.
const (
	maxObjects      = 100000
	maxFilesPerObj  = 10000
	maxNameLen      = 512
	maxLocalIDLen   = 256
	maxIdentLen     = 256
	maxURLLen       = 4096
	manifestMaxCols = 16
)

var (
	profilePattern    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	identifierPattern = regexp.MustCompile(`^[A-Za-z0-9:/._-]{1,256}$`)
)

// digestLengths maps the accepted digest algorithms to their hex length.
var digestLengths = map[string]int{"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}

// normalizeAlg returns the canonical name of a digest algorithm ("SHA-256"
// is sha256), or an error naming the accepted ones.
func normalizeAlg(alg string) (string, error) {
	a := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(alg)), "-", "")
	if _, ok := digestLengths[a]; !ok {
		return "", fmt.Errorf("unknown digest algorithm %q (want md5, sha1, sha256 or sha512)", truncate(alg))
	}
	return a, nil
}

// check validates an object and fills in defaults (file names, canonical
// digest algorithms).
func (o *Object) check() error {
	if len(o.Files) == 0 {
		return errors.New("object: no files")
	}
	if len(o.Files) > maxFilesPerObj {
		return fmt.Errorf("object: %d files is over the limit of %d", len(o.Files), maxFilesPerObj)
	}
	if err := checkLocalID(o.LocalID); err != nil {
		return err
	}
	if err := checkIdentifier(o.Identifier); err != nil {
		return err
	}
	names := make(map[string]bool, len(o.Files))
	for i := range o.Files {
		f := &o.Files[i]
		if err := f.check(); err != nil {
			return fmt.Errorf("object file %d: %w", i+1, err)
		}
		if names[f.Name] {
			return fmt.Errorf("object file %d: name %q appears twice", i+1, f.Name)
		}
		names[f.Name] = true
	}
	return nil
}

// check validates a file and fills in its name and canonical algorithm.
func (f *File) check() error {
	if err := checkURL(f.URL); err != nil {
		return err
	}
	if f.Name == "" {
		f.Name = nameFromURL(f.URL)
	}
	if err := checkName(f.Name); err != nil {
		return err
	}
	switch {
	case f.DigestAlg == "" && f.Digest == "":
	case f.DigestAlg == "":
		return errors.New("digest given without its algorithm")
	case f.Digest == "":
		return fmt.Errorf("digest algorithm %q given without a digest", truncate(f.DigestAlg))
	default:
		alg, err := normalizeAlg(f.DigestAlg)
		if err != nil {
			return err
		}
		f.DigestAlg = alg
		f.Digest = strings.ToLower(f.Digest)
		if _, err := hex.DecodeString(f.Digest); err != nil || len(f.Digest) != digestLengths[alg] {
			return fmt.Errorf("%s digest %q: want %d hex digits", alg, truncate(f.Digest), digestLengths[alg])
		}
	}
	if f.Size != nil && *f.Size < 0 {
		return fmt.Errorf("size %d is negative", *f.Size)
	}
	return nil
}

// checkURL accepts absolute http, https and file URLs.
func checkURL(raw string) error {
	if len(raw) > maxURLLen {
		return fmt.Errorf("URL of %d bytes is over the limit of %d", len(raw), maxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("URL %q: %w", truncate(raw), errors.Unwrap(err))
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return fmt.Errorf("URL %q: no host", truncate(raw))
		}
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return fmt.Errorf("URL %q: a file URL names no host", truncate(raw))
		}
		if !path.IsAbs(u.Path) {
			return fmt.Errorf("URL %q: a file URL needs an absolute path", truncate(raw))
		}
	case "":
		return fmt.Errorf("URL %q: not absolute (want http, https or file)", truncate(raw))
	default:
		return fmt.Errorf("URL %q: scheme %q is not allowed (want http, https or file)", truncate(raw), u.Scheme)
	}
	return nil
}

// nameFromURL returns the last segment of the URL's path.
func nameFromURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return path.Base(u.Path)
}

// checkName accepts relative slash-separated paths without . or ..
// segments.
func checkName(name string) error {
	if name == "" || name == "/" || name == "." {
		return errors.New("file name is empty (give one, or a URL whose path ends in a name)")
	}
	if len(name) > maxNameLen || !utf8.ValidString(name) {
		return fmt.Errorf("file name %q: want at most %d bytes of UTF-8", truncate(name), maxNameLen)
	}
	if strings.HasPrefix(name, "/") || path.Clean(name) != name {
		return fmt.Errorf("file name %q: want a clean relative path", truncate(name))
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == ".." || seg == "." {
			return fmt.Errorf("file name %q: . and .. are not allowed", truncate(name))
		}
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return fmt.Errorf("file name %q: control characters and backslashes are not allowed", truncate(name))
		}
	}
	return nil
}

func checkLocalID(id string) error {
	if len(id) > maxLocalIDLen || !utf8.ValidString(id) {
		return fmt.Errorf("local identifier %q: want at most %d bytes of UTF-8", truncate(id), maxLocalIDLen)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("local identifier %q: control characters are not allowed", truncate(id))
		}
	}
	return nil
}

func checkIdentifier(id string) error {
	if id == "" {
		return nil
	}
	if !identifierPattern.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("primary identifier %q: want 1 to %d characters from A-Z a-z 0-9 : / . _ - and no \"..\"", truncate(id), maxIdentLen)
	}
	return nil
}

// Manifest fields, as named in a checkm "#%fields" line.
const (
	fieldURL        = "nfo:fileurl"
	fieldAlg        = "nfo:hashalgorithm"
	fieldHash       = "nfo:hashvalue"
	fieldSize       = "nfo:filesize"
	fieldModified   = "nfo:filelastmodified"
	fieldName       = "nfo:filename"
	fieldMime       = "mrt:mimetype"
	fieldLocalID    = "mrt:localidentifier"
	fieldIdentifier = "mrt:primaryidentifier"
)

// defaultFields is the column order of a manifest without a "#%fields"
// line.
var defaultFields = []string{fieldURL, fieldAlg, fieldHash, fieldSize, fieldName, fieldLocalID, fieldIdentifier}

var knownFields = map[string]bool{fieldURL: true, fieldAlg: true, fieldHash: true, fieldSize: true,
	fieldModified: true, fieldName: true, fieldMime: true, fieldLocalID: true, fieldIdentifier: true}

// ParseManifest parses a checkm-style manifest into objects. Each
// non-blank line that does not start with '#' names one file, its columns
// separated by '|':
//
//	URL | digest algorithm | digest | size | file name | local id | primary id
//
// Trailing columns may be left out and any column but the URL left empty.
// A "#%fields | nfo:fileUrl | ..." line (checkm 0.7) sets another column
// order; nfo:fileLastModified and mrt:mimeType columns are accepted and
// ignored. Other lines starting with '#' are comments. Files with the same
// local identifier form one object (in order of first appearance); a file
// without one is an object of its own. Errors name the line.
func ParseManifest(text string) ([]Object, error) {
	fields := defaultFields
	var objs []Object
	byLocal := map[string]int{}
	lines := strings.Split(text, "\n")
	for n, line := range lines {
		lineNo := n + 1
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			if rest, ok := strings.CutPrefix(line, "#%fields"); ok {
				fs, err := parseFieldsLine(rest)
				if err != nil {
					return nil, fmt.Errorf("manifest line %d: %w", lineNo, err)
				}
				fields = fs
			}
			continue
		}
		f, localID, ident, err := parseFileLine(line, fields)
		if err != nil {
			return nil, fmt.Errorf("manifest line %d: %w", lineNo, err)
		}
		i, ok := byLocal[localID]
		if localID == "" || !ok {
			if len(objs) == maxObjects {
				return nil, fmt.Errorf("manifest line %d: more than %d objects", lineNo, maxObjects)
			}
			objs = append(objs, Object{LocalID: localID, Identifier: ident})
			i = len(objs) - 1
			if localID != "" {
				byLocal[localID] = i
			}
		}
		o := &objs[i]
		switch {
		case ident == "":
		case o.Identifier == "":
			o.Identifier = ident
		case o.Identifier != ident:
			return nil, fmt.Errorf("manifest line %d: primary identifier %q differs from %q given before for local identifier %q",
				lineNo, ident, o.Identifier, localID)
		}
		for _, g := range o.Files {
			if g.Name == f.Name {
				return nil, fmt.Errorf("manifest line %d: file name %q appears twice in one object", lineNo, f.Name)
			}
		}
		if len(o.Files) == maxFilesPerObj {
			return nil, fmt.Errorf("manifest line %d: more than %d files in one object", lineNo, maxFilesPerObj)
		}
		o.Files = append(o.Files, f)
	}
	if len(objs) == 0 {
		return nil, errors.New("manifest: no file lines")
	}
	return objs, nil
}

// parseFileLine parses and checks one file line whose columns are fields.
func parseFileLine(line string, fields []string) (f File, localID, ident string, err error) {
	cols := strings.Split(line, "|")
	if len(cols) > len(fields) {
		return f, "", "", fmt.Errorf("%d columns, want at most %d", len(cols), len(fields))
	}
	for i, c := range cols {
		c = strings.TrimSpace(c)
		switch fields[i] {
		case fieldURL:
			f.URL = c
		case fieldAlg:
			f.DigestAlg = c
		case fieldHash:
			f.Digest = c
		case fieldSize:
			if c != "" {
				size, err := strconv.ParseInt(c, 10, 64)
				if err != nil || size < 0 {
					return f, "", "", fmt.Errorf("size %q: want a number of bytes", truncate(c))
				}
				f.Size = &size
			}
		case fieldName:
			f.Name = c
		case fieldLocalID:
			localID = c
		case fieldIdentifier:
			ident = c
		}
	}
	if f.URL == "" {
		return f, "", "", errors.New("no file URL")
	}
	if err := f.check(); err != nil {
		return f, "", "", err
	}
	if err := checkLocalID(localID); err != nil {
		return f, "", "", err
	}
	if err := checkIdentifier(ident); err != nil {
		return f, "", "", err
	}
	return f, localID, ident, nil
}

// parseFieldsLine parses the rest of a "#%fields" line.
func parseFieldsLine(rest string) ([]string, error) {
	cols := strings.Split(rest, "|")
	var fields []string
	seen := map[string]bool{}
	for _, c := range cols {
		c = strings.ToLower(strings.TrimSpace(c))
		if c == "" {
			continue
		}
		if !knownFields[c] {
			return nil, fmt.Errorf("#%%fields: unknown field %q", truncate(c))
		}
		if seen[c] {
			return nil, fmt.Errorf("#%%fields: field %q appears twice", c)
		}
		seen[c] = true
		fields = append(fields, c)
	}
	if len(fields) > manifestMaxCols || !seen[fieldURL] {
		return nil, errors.New("#%fields: want nfo:fileUrl and at most 16 fields")
	}
	return fields, nil
}

// strictDecode decodes b into v, rejecting unknown fields and trailing
// data.
func strictDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
