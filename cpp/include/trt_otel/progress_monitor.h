// trt-otel for C++: a TensorRT IProgressMonitor that writes the trt-otel journal (format v1).
//
//     trt_otel::Options options;
//     options.journal = "build.trtotel.jsonl";
//     trt_otel::ProgressMonitor monitor(options);
//     config->setProgressMonitor(&monitor);
//     auto engine = builder->buildSerializedNetwork(*network, *config);
//     monitor.end(engine != nullptr);
//
// It only records: every callback becomes one event of the journal that the Python package
// writes (same event types and fields), as it came, stamped with its time and thread. It checks
// nothing against TensorRT's progress-monitor protocol (a name reused while open, an unknown
// parent, a step out of range, ...): its journal's header says "checked": false, and trt-otel
// takes the recorded callbacks through the one way in that every capture mode takes, which
// finds the anomalies and numbers the events as for the same callbacks made in Python. So
// `trt-otel replay`, `trt-otel watch` (live view, spans, metrics, HTTP view, policies),
// `report`, `diff` and `demo --trace` read a C++ build as they read a Python one, checked once,
// by one piece of code.
//
// What TensorRT's builder threads pay: each callback takes one mutex, reads one clock, looks
// the phase name up in a hash table and appends a fixed-size record to a vector. No I/O, no
// allocation in the usual case (a new phase name or a cancel allocate), never blocks on
// anything but that mutex, never throws; stepComplete answers from an atomic flag. A writer
// thread owned by the monitor turns the records into JSON lines, writes them (at most one poll
// interval after they happened, at once on a cancel and at the end), checks the cancel file and
// the timeout, and notes any loss in the journal.
//
// The build_start event names the TensorRT library the process has actually loaded, not the
// headers it was compiled with: "trt.version" from its getInferLibVersion() (and its build
// number where the library has getInferLibBuildVersion()), "trt.backend" ("tensorrt" or
// "tensorrt-rtx") and "trt.library" from the file that defines it (dladdr), and the headers'
// version apart as "trt.header_version". Both functions are declared weak here, so a program
// that links no TensorRT library still links and runs; its journal then has no trt.version.
//
// Header-only, C++17, needs only the standard library, POSIX (dladdr: glibc 2.34 and later
// have it in libc, older ones need -ldl, which the CMake target adds) and NvInfer.h.
#pragma once

#include <NvInfer.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

// The library's own version functions (NvInferRuntimeBase.h, NvInferRuntime.h), declared again
// weak: resolved by whatever TensorRT library the program links or has loaded, null otherwise.
extern "C" int32_t getInferLibVersion() noexcept __attribute__((weak));
extern "C" int32_t getInferLibBuildVersion() noexcept __attribute__((weak));

namespace trt_otel
{

//! The version of trt-otel this header belongs to (the journal's "producer").
inline constexpr char const* kVersion = "0.1.0";
//! The journal format written.
inline constexpr int kJournalFormatVersion = 1;
//! The journal header's word that its callbacks were recorded as they came, unchecked: trt-otel
//! checks them against TensorRT's protocol when it reads the journal.
inline constexpr char const* kUncheckedHeaderField = "\"checked\":false";

//! How a build ended, named after OpenTelemetry's cicd.pipeline.result values.
enum class Outcome
{
    kSUCCESS,
    kFAILURE,
    kCANCELLATION,
    kTIMEOUT
};

inline char const* toString(Outcome outcome) noexcept
{
    switch (outcome)
    {
    case Outcome::kSUCCESS: return "success";
    case Outcome::kFAILURE: return "failure";
    case Outcome::kCANCELLATION: return "cancellation";
    case Outcome::kTIMEOUT: return "timeout";
    }
    return "failure";
}

//! What the monitor records and watches. Every field has a working default.
struct Options
{
    //! Path of the JSON Lines journal. Empty: no journal. Written as trt-otel's Python writer
    //! writes one: only a regular file (or a path not there yet, created 0666 less the umask),
    //! locked (flock, exclusive) for the monitor's life before it is emptied, so a journal that
    //! another writer (a Python build, another monitor) holds is refused, never cut; see
    //! ProgressMonitor's constructor.
    std::string journal;
    //! Cancel the build when this file exists. Its first line is the reason, or a JSON object
    //! {"reason": ..., "source": ..., "timeout": bool, "policy": ...} (what `trt-otel watch
    //! --control-file` writes, so its decisions keep their source). Empty: no cancel file.
    std::string cancel_file;
    //! Cancel the build once it has run this long (an outcome of "timeout"). Zero: no timeout.
    std::chrono::nanoseconds timeout{0};
    //! The model built, as the build attribute "model.path" (names the build's span).
    std::string model_path;
    //! Further build attributes (strings), recorded in the journal's build_start event.
    std::map<std::string, std::string> attributes;
    //! The build id (also the trace id): 32 lowercase hex digits. Empty: a random one.
    std::string build_id;
    //! How often the writer thread writes the journal and checks the cancel file and timeout.
    std::chrono::milliseconds poll_interval{100};
    //! Events waiting for the writer beyond which new ones are dropped (counted, noted in the
    //! journal, seq gap left) rather than letting memory grow without bound.
    std::size_t max_pending_events{1u << 20};
    //! While the journal is open, the writer touches it this often even with nothing to write:
    //! the sign of life `trt-otel watch` looks for through a build's silent minutes (its header
    //! also names the writing process and host).
    std::chrono::milliseconds touch_interval{10000};
    //! How long end() waits for the journal to be written and synced.
    std::chrono::milliseconds end_timeout{5000};
    //! Print the first journal write error and the first loss on stderr.
    bool warn_on_stderr{true};
};

//! Thrown by ProgressMonitor's constructor when the journal is being written by another writer
//! (a trt-otel build, another monitor: it holds the file's lock). The journal is left whole.
class JournalBusyError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! The TensorRT library this process has loaded, as the build record names it.
struct Runtime
{
    //! "tensorrt" or "tensorrt-rtx" (from the library's file name); empty when none is loaded.
    std::string backend;
    //! Its version, "MAJOR.MINOR.PATCH[.BUILD]", from getInferLibVersion(); empty when none.
    std::string version;
    //! The file it was loaded from (the program itself when TensorRT is linked statically).
    std::string library;
};

//! The version of the TensorRT headers this code was compiled with ("11.1.0.106").
inline std::string headerVersion()
{
    return std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + "."
        + std::to_string(NV_TENSORRT_PATCH)
#if defined(NV_TENSORRT_BUILD)
        + "." + std::to_string(NV_TENSORRT_BUILD)
#endif
        ;
}

//! Asks the loaded TensorRT library who it is. Never throws; an empty Runtime when the program
//! has no TensorRT library.
inline Runtime loadedRuntime() noexcept
{
    Runtime runtime;
    try
    {
        if (&::getInferLibVersion == nullptr)
            return runtime;
        // (MAJOR * 100 + MINOR) * 100 + PATCH, as NV_TENSORRT_VERSION.
        std::int32_t const number = ::getInferLibVersion();
        runtime.version = std::to_string(number / 10000) + "." + std::to_string(number / 100 % 100) + "."
            + std::to_string(number % 100);
        Dl_info where{};
        if (::dladdr(reinterpret_cast<void*>(&::getInferLibVersion), &where) != 0 && where.dli_fname != nullptr)
            runtime.library = where.dli_fname;
        // The build number only from the same library (an older one may not have the function).
        Dl_info buildWhere{};
        if (&::getInferLibBuildVersion != nullptr
            && ::dladdr(reinterpret_cast<void*>(&::getInferLibBuildVersion), &buildWhere) != 0
            && buildWhere.dli_fbase == where.dli_fbase)
            runtime.version += "." + std::to_string(::getInferLibBuildVersion());
        // libnvinfer.so.N is TensorRT; libtensorrt_rtx.so.N is TensorRT for RTX.
        std::string_view const file = std::string_view(runtime.library).substr(runtime.library.rfind('/') + 1);
        runtime.backend = file.find("tensorrt_rtx") != std::string_view::npos ? "tensorrt-rtx" : "tensorrt";
    }
    catch (...)
    {
    }
    return runtime;
}

namespace detail
{

enum class Type : std::uint8_t
{
    kBUILD_START,
    kPHASE_START,
    kSTEP,
    kPHASE_FINISH,
    kCANCEL,
    kANOMALY,
    kLOG,
    kBUILD_END,
};

//! The text fields of the rare events (anomaly, cancel, log, build_end).
struct Extra
{
    std::string a; // detail, reason or message
    std::string b; // kind, source, severity or error_type
    std::string c; // policy
};

//! One event waiting for the writer: fixed size, so the usual callback allocates nothing.
//! Phase names and thread labels are indices into tables the writer copies as they grow.
struct Record
{
    std::int64_t seq;
    std::int64_t wall_ns;
    std::int64_t mono_ns;
    std::int64_t number; // num_steps, step; build_end: 1 when error_type is set
    std::int32_t thread;
    std::int32_t name;   // -1: none (an anomaly of no phase)
    std::int32_t parent; // -1: null
    Type type;
    std::uint8_t flag; // cancel: timeout; build_end: outcome
    std::unique_ptr<Extra> extra;
};

inline std::int64_t wallNs() noexcept
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::system_clock::now().time_since_epoch())
        .count();
}

//! CLOCK_MONOTONIC in libstdc++ and libc++ on Linux: the clock Python's time.monotonic_ns
//! reads, so another process (trt-otel watch) can measure against the journal's mono_ns.
inline std::int64_t monoNs() noexcept
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

//! Durations as the Python package prints them: 0.4s, 12.3s, 4m05s, 2h03m.
inline std::string formatDuration(double seconds)
{
    char text[48];
    if (seconds < 60)
    {
        std::snprintf(text, sizeof text, "%.1fs", seconds);
        return text;
    }
    long long const whole = static_cast<long long>(seconds);
    long long const minutes = whole / 60;
    if (minutes < 60)
    {
        std::snprintf(text, sizeof text, "%lldm%02llds", minutes, whole % 60);
        return text;
    }
    std::snprintf(text, sizeof text, "%lldh%02lldm", minutes / 60, minutes % 60);
    return text;
}

//! Appends `text` as a JSON string: escapes quotes, backslashes and control characters, and
//! replaces bytes that are not UTF-8 with U+FFFD, so every line is valid JSON.
inline void appendJsonString(std::string& out, std::string_view text)
{
    out += '"';
    std::size_t i = 0;
    std::size_t const n = text.size();
    while (i < n)
    {
        auto const byte = static_cast<unsigned char>(text[i]);
        if (byte < 0x80)
        {
            switch (byte)
            {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (byte < 0x20)
                {
                    char hex[8];
                    std::snprintf(hex, sizeof hex, "\\u%04x", byte);
                    out += hex;
                }
                else
                    out += static_cast<char>(byte);
            }
            ++i;
            continue;
        }
        // A multi-byte sequence: copied when well formed (no overlongs, no surrogates).
        std::size_t length = 0;
        std::uint32_t lowest = 0;
        if ((byte & 0xE0) == 0xC0)
        {
            length = 2;
            lowest = 0x80;
        }
        else if ((byte & 0xF0) == 0xE0)
        {
            length = 3;
            lowest = 0x800;
        }
        else if ((byte & 0xF8) == 0xF0)
        {
            length = 4;
            lowest = 0x10000;
        }
        bool valid = length != 0 && i + length <= n;
        std::uint32_t code = length == 0 ? 0 : (byte & (0x7F >> length));
        for (std::size_t k = 1; valid && k < length; ++k)
        {
            auto const next = static_cast<unsigned char>(text[i + k]);
            valid = (next & 0xC0) == 0x80;
            code = (code << 6) | (next & 0x3F);
        }
        valid = valid && code >= lowest && code <= 0x10FFFF && (code < 0xD800 || code > 0xDFFF);
        if (valid)
        {
            out.append(text.data() + i, length);
            i += length;
        }
        else
        {
            out += "\\ufffd";
            ++i;
        }
    }
    out += '"';
}

template <typename Integer>
inline void appendInt(std::string& out, Integer value)
{
    char digits[24];
    auto const result = std::to_chars(digits, digits + sizeof digits, value);
    out.append(digits, result.ptr);
}

//! A value of a flat JSON object (what the control file and the test traces hold).
struct JsonValue
{
    enum class Kind
    {
        kNULL,
        kBOOL,
        kNUMBER,
        kSTRING
    } kind{Kind::kNULL};
    bool boolean{false};
    double number{0};
    std::string text;
};

//! Parses one JSON object whose values are scalars (no nesting). nullopt when it is not one.
inline std::optional<std::map<std::string, JsonValue>> parseFlatJsonObject(std::string_view in)
{
    std::size_t pos = 0;
    auto skip = [&] {
        while (pos < in.size() && (in[pos] == ' ' || in[pos] == '\t' || in[pos] == '\r' || in[pos] == '\n'))
            ++pos;
    };
    auto appendUtf8 = [](std::string& out, std::uint32_t code) {
        if (code < 0x80)
            out += static_cast<char>(code);
        else if (code < 0x800)
        {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
        }
        else if (code < 0x10000)
        {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        }
        else
        {
            out += static_cast<char>(0xF0 | (code >> 18));
            out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        }
    };
    auto hex4 = [&](std::uint32_t& code) {
        if (pos + 4 > in.size())
            return false;
        code = 0;
        for (int k = 0; k < 4; ++k)
        {
            char const c = in[pos++];
            code <<= 4;
            if (c >= '0' && c <= '9')
                code |= static_cast<std::uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                code |= static_cast<std::uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                code |= static_cast<std::uint32_t>(c - 'A' + 10);
            else
                return false;
        }
        return true;
    };
    auto string = [&](std::string& out) {
        if (pos >= in.size() || in[pos] != '"')
            return false;
        ++pos;
        while (pos < in.size())
        {
            char const c = in[pos++];
            if (c == '"')
                return true;
            if (c != '\\')
            {
                out += c;
                continue;
            }
            if (pos >= in.size())
                return false;
            char const e = in[pos++];
            switch (e)
            {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u':
            {
                std::uint32_t code = 0;
                if (!hex4(code))
                    return false;
                if (code >= 0xD800 && code < 0xDC00 && pos + 6 <= in.size() && in[pos] == '\\'
                    && in[pos + 1] == 'u')
                {
                    pos += 2;
                    std::uint32_t low = 0;
                    if (!hex4(low) || low < 0xDC00 || low > 0xDFFF)
                        return false;
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                }
                appendUtf8(out, code);
                break;
            }
            default: return false;
            }
        }
        return false;
    };
    std::map<std::string, JsonValue> object;
    skip();
    if (pos >= in.size() || in[pos] != '{')
        return std::nullopt;
    ++pos;
    skip();
    if (pos < in.size() && in[pos] == '}')
        return object;
    while (true)
    {
        skip();
        std::string key;
        if (!string(key))
            return std::nullopt;
        skip();
        if (pos >= in.size() || in[pos] != ':')
            return std::nullopt;
        ++pos;
        skip();
        JsonValue value;
        if (pos >= in.size())
            return std::nullopt;
        if (in[pos] == '"')
        {
            value.kind = JsonValue::Kind::kSTRING;
            if (!string(value.text))
                return std::nullopt;
        }
        else if (in.substr(pos, 4) == "true" || in.substr(pos, 5) == "false")
        {
            value.kind = JsonValue::Kind::kBOOL;
            value.boolean = in[pos] == 't';
            pos += value.boolean ? 4 : 5;
        }
        else if (in.substr(pos, 4) == "null")
            pos += 4;
        else
        {
            std::size_t const begin = pos;
            while (pos < in.size() && std::strchr("+-0123456789.eE", in[pos]) != nullptr)
                ++pos;
            if (pos == begin)
                return std::nullopt;
            std::string const digits(in.substr(begin, pos - begin));
            char* end = nullptr;
            value.number = std::strtod(digits.c_str(), &end);
            if (end != digits.c_str() + digits.size())
                return std::nullopt;
            value.kind = JsonValue::Kind::kNUMBER;
        }
        object[std::move(key)] = std::move(value);
        skip();
        if (pos < in.size() && in[pos] == ',')
        {
            ++pos;
            continue;
        }
        if (pos < in.size() && in[pos] == '}')
            return object;
        return std::nullopt;
    }
}

//! What a file that is not a regular one is, in words (as the Python package says it).
inline char const* fileKind(mode_t mode) noexcept
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a named pipe";
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return "a device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "not a file";
}

//! At most `limit` characters (code points) of UTF-8 `text`.
inline std::string firstCharacters(std::string text, std::size_t limit)
{
    std::size_t characters = 0;
    for (std::size_t i = 0; i < text.size(); ++i)
    {
        if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80 && ++characters > limit)
        {
            text.resize(i);
            break;
        }
    }
    return text;
}

//! Who writes the journal at `path`, as its header says: the words of the Python package's
//! JournalBusyError ("trt-otel pid N on host H (give each build its own journal)").
inline std::string writerOf(std::string const& path)
{
    static constexpr std::size_t kMaxHeaderBytes = 64 * 1024;
    std::string line;
    int const fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0)
    {
        struct stat info{};
        if (::fstat(fd, &info) == 0 && S_ISREG(info.st_mode))
        {
            char buffer[4096];
            while (line.size() < kMaxHeaderBytes && line.find('\n') == std::string::npos)
            {
                ssize_t const got = ::read(fd, buffer, sizeof buffer);
                if (got < 0 && errno == EINTR)
                    continue;
                if (got <= 0)
                    break;
                line.append(buffer, static_cast<std::size_t>(got));
            }
        }
        ::close(fd);
    }
    auto const header = parseFlatJsonObject(std::string_view(line).substr(0, line.find('\n')));
    if (!header)
        return "another trt-otel";
    auto const format = header->find("format");
    if (format == header->end() || format->second.kind != JsonValue::Kind::kSTRING
        || format->second.text != "trt-otel-journal")
        return "another trt-otel";
    auto const shown = [&](char const* key) -> std::optional<std::string> {
        auto const found = header->find(key);
        if (found == header->end() || found->second.kind == JsonValue::Kind::kNULL)
            return std::nullopt;
        JsonValue const& value = found->second;
        if (value.kind == JsonValue::Kind::kSTRING)
            return value.text;
        if (value.kind == JsonValue::Kind::kBOOL)
            return std::string(value.boolean ? "True" : "False");
        char number[32];
        std::snprintf(number, sizeof number, "%.17g", value.number);
        return std::string(number);
    };
    std::string const where = shown("writer_host") ? " on host " + firstCharacters(*shown("writer_host"), 64) : "";
    return "trt-otel pid " + firstCharacters(shown("writer_pid").value_or("None"), 20) + where
        + " (give each build its own journal)";
}

//! A named pipe given as the journal: a consumer's stream, written while it has a reader. Opened
//! without blocking, so a pipe nobody reads is refused at once (the open would wait for ever);
//! then written blocking, by the writer thread alone (a consumer that stops reading fills the
//! pipe, and the events past max_pending are counted as lost: the build never waits).
inline int openPipe(std::string const& path)
{
    int const fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
    {
        int const error = errno;
        throw std::runtime_error("trt-otel: journal " + path + " is a named pipe "
            + (error == ENXIO ? std::string("that nobody reads") : "that cannot be opened: " + std::string(std::strerror(error))));
    }
    int const flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    {
        int const error = errno;
        ::close(fd);
        throw std::runtime_error("trt-otel: cannot open journal " + path + ": " + std::strerror(error));
    }
    return fd;
}

//! The journal at `path` opened for writing as the Python package's JournalWriter opens it:
//! a regular file (a device or a directory is no journal; a named pipe is a consumer's stream,
//! see openPipe), checked before it is opened and again on the open descriptor (never opened
//! blocking); locked (flock, exclusive, released when it is closed or its process dies) before
//! it is emptied, so one that another writer holds is refused (JournalBusyError) and left whole.
inline int openJournal(std::string const& path)
{
    auto const notRegular = [&](mode_t mode) {
        return std::runtime_error(
            "trt-otel: journal " + path + " is " + fileKind(mode) + ", not a regular file");
    };
    struct stat info{};
    if (::stat(path.c_str(), &info) == 0 && S_ISFIFO(info.st_mode))
        return openPipe(path);
    if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
        throw notRegular(info.st_mode);
    int const fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
    if (fd < 0)
        throw std::runtime_error("trt-otel: cannot create journal " + path + ": " + std::strerror(errno));
    auto const fail = [&](std::string const& what) {
        int const error = errno;
        ::close(fd);
        return std::runtime_error("trt-otel: cannot " + what + " journal " + path + ": " + std::strerror(error));
    };
    if (::fstat(fd, &info) != 0)
        throw fail("examine");
    if (!S_ISREG(info.st_mode)) // swapped in after the check above
    {
        ::close(fd);
        throw notRegular(info.st_mode);
    }
    int const flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        throw fail("open");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
    {
        if (errno != EWOULDBLOCK)
            throw fail("lock");
        ::close(fd);
        throw JournalBusyError("trt-otel: journal " + path + " is already being written by " + writerOf(path));
    }
    if (::ftruncate(fd, 0) != 0)
        throw fail("empty");
    return fd;
}

//! A label for the calling thread: its name and its id ("trtbuild/4242").
inline std::string threadLabel()
{
#if defined(__linux__)
    char name[32] = {};
    prctl(PR_GET_NAME, name, 0, 0, 0);
    std::string label = name[0] != '\0' ? name : "thread";
    label += '/';
    appendInt(label, static_cast<long long>(syscall(SYS_gettid)));
    return label;
#else
    std::string label = "thread/";
    appendInt(label, static_cast<unsigned long long>(std::hash<std::thread::id>{}(std::this_thread::get_id())));
    return label;
#endif
}

inline std::string randomBuildId()
{
    std::random_device device;
    std::mt19937_64 engine((static_cast<std::uint64_t>(device()) << 32) ^ device()
        ^ static_cast<std::uint64_t>(monoNs()));
    std::uint64_t const high = engine();
    std::uint64_t const low = engine();
    // A version-4 UUID's bits, as Python's uuid.uuid4().hex.
    std::uint64_t const words[2] = {(high & ~0xF000ull) | 0x4000ull,
        (low & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull};
    char text[33];
    std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(words[0]),
        static_cast<unsigned long long>(words[1]));
    return text;
}

inline std::uint64_t nextMonitorUid() noexcept
{
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
}

//! Which monitor the calling thread last registered with, and its index there.
struct ThreadSlot
{
    std::uint64_t monitor{0};
    std::int32_t index{-1};
};

inline ThreadSlot& threadSlot() noexcept
{
    static thread_local ThreadSlot slot;
    return slot;
}

} // namespace detail

//! A TensorRT progress monitor that records the build in the trt-otel journal.
//!
//! TensorRT calls phaseStart, stepComplete and phaseFinish from its builder threads; they are
//! noexcept, take one short lock and do no I/O. cancel(), cancelled() and end() may be called
//! from any thread. One monitor records one build.
class ProgressMonitor : public nvinfer1::IProgressMonitor
{
public:
    //! Opens the journal and starts the writer thread. Throws before the build, never during
    //! it: std::runtime_error when the journal cannot be created or written, or is there but is
    //! not a regular file (a named pipe, a device, a directory: refused at once, never opened
    //! blocking); JournalBusyError (a std::runtime_error) when another writer holds it (its
    //! lock), naming that writer from its header. A journal no one holds (a finished build's)
    //! is emptied once the lock is taken, as the Python writer does.
    explicit ProgressMonitor(Options options = Options())
        : mOptions(std::move(options))
        , mUid(detail::nextMonitorUid())
    {
        if (mOptions.build_id.empty())
            mOptions.build_id = detail::randomBuildId();
        if (mOptions.poll_interval <= std::chrono::milliseconds(0))
            mOptions.poll_interval = std::chrono::milliseconds(100);
        if (mOptions.touch_interval <= std::chrono::milliseconds(0))
            mOptions.touch_interval = std::chrono::milliseconds(10000);
        if (!mOptions.journal.empty())
        {
            mFd = detail::openJournal(mOptions.journal);
            std::string header = "{\"format\":\"trt-otel-journal\",\"version\":";
            detail::appendInt(header, kJournalFormatVersion);
            header += ",\"created_wall_ns\":";
            detail::appendInt(header, detail::wallNs());
            header += ",\"producer\":\"trt-otel-cpp ";
            header += kVersion;
            // Who writes it, so `trt-otel watch` can tell a silent build from a lost one.
            header += "\",\"writer_pid\":";
            detail::appendInt(header, static_cast<long long>(::getpid()));
            header += ",\"writer_host\":";
            char host[256] = {};
            ::gethostname(host, sizeof host - 1);
            detail::appendJsonString(header, host);
            header += ",\"touch_interval_s\":";
            char interval[32];
            std::snprintf(interval, sizeof interval, "%g", static_cast<double>(mOptions.touch_interval.count()) / 1000.0);
            header += interval;
            header += std::strpbrk(interval, ".e") == nullptr ? ".0," : ",";
            header += kUncheckedHeaderField;
            header += "}\n";
            if (!writeAll(header.data(), header.size()))
            {
                std::string const why = std::strerror(errno);
                ::close(mFd);
                throw std::runtime_error("trt-otel: cannot write journal " + mOptions.journal + ": " + why);
            }
        }
        mPending.reserve(4096);
        mWriter = std::thread([this] { runWriter(); });
    }

    ProgressMonitor(ProgressMonitor const&) = delete;
    ProgressMonitor& operator=(ProgressMonitor const&) = delete;

    //! Writes what is left and closes the journal. A build never ended (end() not called: the
    //! program is unwinding from an error) keeps no build_end, so it reads back as unfinished,
    //! like the journal of a killed process; a log event says why.
    ~ProgressMonitor() noexcept override
    {
        {
            std::lock_guard<std::mutex> lock(mMutex);
            if (mStarted && !mEnded)
                appendLog(stamp(), "warning",
                    "trt-otel: the monitor was destroyed before end(); the build's outcome is unknown");
            mStop = true;
            mWake = true;
        }
        mWakeCv.notify_one();
        if (mWriter.joinable())
            mWriter.join();
        if (mFd >= 0)
        {
            ::fsync(mFd);
            ::close(mFd);
        }
    }

    // -- TensorRT's callbacks (builder threads) ------------------------------------------------

    //! TensorRT: a phase began. Recorded as it came; never blocks on I/O, never throws.
    void phaseStart(char const* phaseName, char const* parentPhase, int32_t nbSteps) noexcept override
    {
        try
        {
            std::lock_guard<std::mutex> lock(mMutex);
            auto const now = stamp();
            startBuild(now);
            std::int32_t const name = intern(text(now, phaseName, "phase_name"));
            std::int32_t const parent = parentPhase == nullptr ? -1 : intern(parentPhase);
            detail::Record& record = append(now, detail::Type::kPHASE_START);
            record.name = name;
            record.parent = parent;
            record.number = nbSteps;
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
    }

    //! TensorRT: a step of a phase completed. Recorded as it came; returns false once the build
    //! must stop. O(1), never blocks on I/O, never throws.
    bool stepComplete(char const* phaseName, int32_t step) noexcept override
    {
        try
        {
            std::lock_guard<std::mutex> lock(mMutex);
            auto const now = stamp();
            startBuild(now);
            std::int32_t const name = intern(text(now, phaseName, "phase_name"));
            detail::Record& record = append(now, detail::Type::kSTEP);
            record.name = name;
            record.number = step;
            // Read under the lock: a step recorded after the cancel event is always refused.
            return !mCancelled.load(std::memory_order_relaxed);
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
        return !mCancelled.load(std::memory_order_relaxed);
    }

    //! TensorRT: a phase ended. Recorded as it came; never blocks on I/O, never throws.
    void phaseFinish(char const* phaseName) noexcept override
    {
        try
        {
            std::lock_guard<std::mutex> lock(mMutex);
            auto const now = stamp();
            startBuild(now);
            std::int32_t const name = intern(text(now, phaseName, "phase_name"));
            append(now, detail::Type::kPHASE_FINISH).name = name;
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
    }

    // -- the application's side (any thread) --------------------------------------------------

    //! Records the build's start (the first callback does it otherwise). Starts the timeout.
    void start() noexcept
    {
        try
        {
            std::lock_guard<std::mutex> lock(mMutex);
            startBuild(stamp());
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
    }

    //! Asks TensorRT to stop: the next stepComplete answers false. Thread-safe. Only the first
    //! request is recorded (a cancel event with its reason); returns true if this one was it.
    //! `source` is the kind of decider (user, timeout, file, http, stall, signal).
    bool cancel(std::string_view reason, std::string_view source = "user", bool timeout = false,
        std::string_view policy = "") noexcept
    {
        try
        {
            {
                std::lock_guard<std::mutex> lock(mMutex);
                if (mCancelled.load(std::memory_order_relaxed))
                    return false;
                auto const now = stamp();
                startBuild(now);
                detail::Record& record = append(now, detail::Type::kCANCEL, true);
                record.flag = timeout ? 1 : 0;
                record.extra.reset(new detail::Extra{std::string(reason), std::string(source), std::string(policy)});
                mCancelReason = std::string(reason);
                mCancelTimeout = timeout;
                mCancelled.store(true, std::memory_order_relaxed);
                mWake = true;
            }
            mWakeCv.notify_one(); // written at once, not at the next poll
            return true;
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
            mCancelled.store(true, std::memory_order_relaxed); // the stop matters more than the record
            return false;
        }
    }

    //! True once a cancel was requested (by cancel(), the cancel file or the timeout).
    bool cancelled() const noexcept { return mCancelled.load(std::memory_order_relaxed); }

    //! Records the build's end from what buildSerializedNetwork returned (trt-otel closes the
    //! phases still open when it reads it) and waits (at most Options::end_timeout) for the
    //! journal to be written and synced. No engine is a cancellation (or a timeout) when a cancel was asked, a failure
    //! otherwise. Calling it again changes nothing. Returns the outcome recorded.
    Outcome end(bool engineBuilt, std::string_view failureDetail = {}) noexcept
    {
        std::int64_t endSeq = -1;
        Outcome outcome = Outcome::kFAILURE;
        try
        {
            std::unique_lock<std::mutex> lock(mMutex);
            if (mEnded)
                return mOutcome;
            auto const now = stamp();
            startBuild(now);
            std::string detail;
            std::string errorType;
            if (engineBuilt)
                outcome = Outcome::kSUCCESS;
            else if (mCancelled.load(std::memory_order_relaxed))
            {
                outcome = mCancelTimeout ? Outcome::kTIMEOUT : Outcome::kCANCELLATION;
                detail = mCancelReason;
                if (outcome == Outcome::kTIMEOUT)
                    errorType = "timeout";
            }
            else
            {
                outcome = Outcome::kFAILURE;
                detail = failureDetail.empty() ? std::string("TensorRT returned no engine") : std::string(failureDetail);
                errorType = "BuildFailed";
            }
            detail::Record& record = append(now, detail::Type::kBUILD_END, true);
            record.flag = static_cast<std::uint8_t>(outcome);
            record.number = errorType.empty() ? 0 : 1;
            record.extra.reset(new detail::Extra{std::move(detail), std::move(errorType), {}});
            endSeq = record.seq;
            mEnded = true;
            mOutcome = outcome;
            mWake = true;
            mWakeCv.notify_one();
            mWrittenCv.wait_for(lock, mOptions.end_timeout, [&] { return mWrittenThrough >= endSeq; });
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
        return outcome;
    }

    //! Records a message of the builder's logger (see trt_otel::Logger). Thread-safe.
    void log(std::string_view severity, std::string_view message) noexcept
    {
        try
        {
            std::lock_guard<std::mutex> lock(mMutex);
            appendLog(stamp(), severity, message);
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
    }

    std::string const& buildId() const noexcept { return mOptions.build_id; }
    Options const& options() const noexcept { return mOptions; }

    //! Events that did not reach the journal (dropped while the writer could not keep up, or
    //! whose write failed). Each loss is also noted in the journal once it can be written.
    std::uint64_t eventsLost() const noexcept { return mLost.load(std::memory_order_relaxed); }
    //! Events recorded so far (the next seq).
    std::int64_t eventsRecorded() const
    {
        std::lock_guard<std::mutex> lock(mMutex);
        return mNextSeq;
    }
    //! Callbacks that failed inside the monitor (out of memory); each was still answered.
    std::uint64_t internalErrors() const noexcept { return mInternalErrors.load(std::memory_order_relaxed); }

private:
    struct Stamp
    {
        std::int64_t wall_ns;
        std::int64_t mono_ns;
        std::int32_t thread;
    };

    // -- under mMutex ----------------------------------------------------------------------------

    Stamp stamp()
    {
        detail::ThreadSlot& slot = detail::threadSlot();
        if (slot.monitor != mUid)
        {
            auto const key = std::this_thread::get_id();
            auto found = mThreadIndex.find(key);
            if (found == mThreadIndex.end())
            {
                mThreadText.push_back(detail::threadLabel());
                found = mThreadIndex.emplace(key, static_cast<std::int32_t>(mThreadText.size() - 1)).first;
            }
            slot.monitor = mUid;
            slot.index = found->second;
        }
        // One clock read per callback (each costs as much as the rest of a step): the wall
        // time is the monotonic time anchored to the wall clock when the monitor was created,
        // as the span projection anchors it anyway.
        std::int64_t const mono = detail::monoNs();
        return Stamp{mWallAnchor + (mono - mMonoAnchor), mono, slot.index};
    }

    //! A new record, numbered and stamped. Beyond max_pending_events an ordinary event is
    //! dropped (its seq is still used, so readers see the gap) and counted; the critical ones
    //! (start, cancel, end) are always kept.
    detail::Record& append(Stamp const& now, detail::Type type, bool critical = false)
    {
        std::int64_t const seq = mNextSeq++;
        if (!critical && mPending.size() >= mOptions.max_pending_events)
        {
            ++mDroppedUnreported;
            mLost.fetch_add(1, std::memory_order_relaxed);
            mScratch = detail::Record{seq, now.wall_ns, now.mono_ns, 0, now.thread, -1, -1, type, 0, nullptr};
            return mScratch;
        }
        mPending.push_back(detail::Record{seq, now.wall_ns, now.mono_ns, 0, now.thread, -1, -1, type, 0, nullptr});
        return mPending.back();
    }

    void startBuild(Stamp const& now)
    {
        if (mStarted)
            return;
        mStarted = true;
        mStartMono = now.mono_ns;
        append(now, detail::Type::kBUILD_START, true);
    }

    //! A phase name as the callback gave it. A null pointer (no name at all, which the journal
    //! cannot hold as a string) is the recorder's own note: an anomaly, and the name "(null)".
    std::string_view text(Stamp const& now, char const* value, char const* argument)
    {
        if (value != nullptr)
            return value;
        detail::Record& record = append(now, detail::Type::kANOMALY);
        record.extra.reset(
            new detail::Extra{std::string(argument) + " is a null pointer, not a str", "invalid_argument", {}});
        return "(null)";
    }

    void appendLog(Stamp const& now, std::string_view severity, std::string_view message, bool critical = false)
    {
        detail::Record& record = append(now, detail::Type::kLOG, critical);
        record.extra.reset(new detail::Extra{std::string(message), std::string(severity), {}});
    }

    //! The index of a phase name in the table the writer copies (added when new).
    std::int32_t intern(std::string_view name)
    {
        auto const found = mNameIndex.find(name);
        if (found != mNameIndex.end())
            return found->second;
        // A deque never moves its strings, so the views keyed on them stay valid.
        mNameText.emplace_back(name);
        auto const index = static_cast<std::int32_t>(mNameText.size() - 1);
        mNameIndex.emplace(std::string_view(mNameText.back()), index);
        return index;
    }

    // -- the writer thread ---------------------------------------------------------------------

    void runWriter() noexcept
    {
        std::vector<detail::Record> batch;
        batch.reserve(4096);
        std::int64_t lastTouch = detail::monoNs();
        std::int64_t const touchNs
            = std::chrono::duration_cast<std::chrono::nanoseconds>(mOptions.touch_interval).count();
        std::unique_lock<std::mutex> lock(mMutex);
        while (true)
        {
            if (!mStop && !mWake)
                mWakeCv.wait_for(lock, mOptions.poll_interval);
            mWake = false;
            batch.swap(mPending);
            // Names and thread labels only grow; the records of this batch use only these.
            while (mWriterNames.size() < mNameText.size())
                mWriterNames.push_back(mNameText[mWriterNames.size()]);
            while (mWriterThreads.size() < mThreadText.size())
                mWriterThreads.push_back(mThreadText[mWriterThreads.size()]);
            bool const stopping = mStop;
            bool const deciding = mStarted && !mEnded && !mCancelled.load(std::memory_order_relaxed);
            std::int64_t const startMono = mStartMono;
            lock.unlock();

            // Only a batch written whole says the journal can be written again: a wake-up with
            // nothing to write says nothing of a disk that is still full (a loss noted then
            // was lost with its note, and never said).
            bool wroteAll = false;
            try
            {
                if (!batch.empty())
                    wroteAll = writeBatch(batch);
            }
            catch (...)
            {
                wroteAll = false;
            }
            std::int64_t const through = batch.empty() ? -1 : batch.back().seq;
            batch.clear();
            if (deciding)
                checkPolicies(startMono);
            if (mFd >= 0 && detail::monoNs() - lastTouch >= touchNs)
            {
                ::futimens(mFd, nullptr); // a sign of life, never a reason to fail
                lastTouch = detail::monoNs();
            }

            lock.lock();
            if (through >= 0)
                mWrittenThrough = through;
            mWrittenCv.notify_all();
            if (wroteAll && (mDroppedUnreported > 0 || mFailedUnreported > 0) && mFd >= 0)
            {
                // Said in the journal as soon as it can be: the gap in seq shows where.
                std::string message = "trt-otel: ";
                detail::appendInt(message, mDroppedUnreported + mFailedUnreported);
                message += " events did not reach the journal (";
                message += mDroppedUnreported > 0 ? "the writer could not keep up" : "";
                message += mDroppedUnreported > 0 && mFailedUnreported > 0 ? "; " : "";
                message += mFailedUnreported > 0 ? "write failed: " + mWriteError : "";
                message += ")";
                mDroppedUnreported = 0;
                mFailedUnreported = 0;
                try
                {
                    // Kept even when the queue is full: dropping the note would hide the loss.
                    appendLog(stamp(), "error", message, true);
                }
                catch (...)
                {
                }
                mWake = true;
            }
            if (stopping && mPending.empty())
                break;
        }
    }

    void checkPolicies(std::int64_t startMono) noexcept
    {
        try
        {
            if (!mOptions.cancel_file.empty())
            {
                struct stat info{};
                if (::stat(mOptions.cancel_file.c_str(), &info) == 0)
                {
                    cancelFromFile();
                    return;
                }
            }
            if (mOptions.timeout.count() > 0 && detail::monoNs() - startMono >= mOptions.timeout.count())
            {
                std::string const limit = detail::formatDuration(static_cast<double>(mOptions.timeout.count()) / 1e9);
                cancel("the build ran past its timeout of " + limit, "timeout", true, policyDescription());
            }
        }
        catch (...)
        {
            mInternalErrors.fetch_add(1, std::memory_order_relaxed);
        }
    }

    //! The options' policies, described as the Python package describes them.
    std::string policyDescription() const
    {
        std::vector<std::string> parts;
        if (mOptions.timeout.count() > 0)
            parts.push_back("timeout(" + detail::formatDuration(static_cast<double>(mOptions.timeout.count()) / 1e9) + ")");
        if (!mOptions.cancel_file.empty())
            parts.push_back("file(" + mOptions.cancel_file + ")");
        if (parts.size() == 1)
            return parts[0];
        std::string joined = "any_of(";
        for (std::size_t i = 0; i < parts.size(); ++i)
            joined += (i ? ", " : "") + parts[i];
        return joined + ")";
    }

    void cancelFromFile()
    {
        static constexpr std::size_t kMaxReason = 200;
        std::string line;
        int const fd = ::open(mOptions.cancel_file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
        {
            char buffer[4 * kMaxReason];
            ssize_t const got = ::read(fd, buffer, sizeof buffer);
            ::close(fd);
            if (got > 0)
                line.assign(buffer, static_cast<std::size_t>(got));
            line = line.substr(0, line.find('\n'));
        }
        std::string reason;
        std::string source = "file";
        bool timeout = false;
        std::string policy = policyDescription();
        if (auto object = detail::parseFlatJsonObject(line))
        {
            auto const text = [&](char const* key) -> std::string const* {
                auto const found = object->find(key);
                return found != object->end() && found->second.kind == detail::JsonValue::Kind::kSTRING
                    ? &found->second.text
                    : nullptr;
            };
            if (auto const* value = text("reason"))
                reason = *value;
            if (auto const* value = text("source"))
            {
                // What trt-otel watch may write: its policies' sources (trt_otel.core.events.CancelSource), POST /cancel's, a signal's.
                static constexpr std::string_view kSources[] = {"timeout", "deadline", "stall", "memory", "file", "http", "signal", "user"};
                if (std::find(std::begin(kSources), std::end(kSources), *value) != std::end(kSources))
                    source = *value;
            }
            if (auto const* value = text("policy"))
                policy = *value;
            auto const flag = object->find("timeout");
            timeout = flag != object->end() && flag->second.kind == detail::JsonValue::Kind::kBOOL
                && flag->second.boolean;
        }
        else
            reason = line;
        reason = detail::firstCharacters(trim(reason), kMaxReason); // code points, not bytes
        if (reason.empty())
            reason = "cancel file " + mOptions.cancel_file + " appeared";
        cancel(reason, source, timeout, policy);
    }

    static std::string trim(std::string const& value)
    {
        auto const isSpace = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; };
        std::size_t begin = 0;
        std::size_t end = value.size();
        while (begin < end && isSpace(value[begin]))
            ++begin;
        while (end > begin && isSpace(value[end - 1]))
            --end;
        return value.substr(begin, end - begin);
    }

    //! Formats and writes a batch; false when (part of) it could not be written.
    bool writeBatch(std::vector<detail::Record> const& batch)
    {
        if (mFd < 0)
            return true;
        std::string out;
        out.reserve(batch.size() * 96);
        std::vector<std::size_t> lineEnds;
        lineEnds.reserve(batch.size());
        bool sync = false;
        for (detail::Record const& record : batch)
        {
            format(out, record);
            lineEnds.push_back(out.size());
            sync = sync || record.type == detail::Type::kBUILD_END;
        }
        if (mTornTail)
        {
            // An earlier write stopped mid-line: end that fragment, so only it reads as corrupt.
            if (!writeAll("\n", 1))
                return failed(batch.size(), errno);
            mTornTail = false;
        }
        std::size_t written = 0;
        bool const ok = writeAll(out.data(), out.size(), &written);
        if (!ok)
        {
            int const error = errno;
            std::size_t const complete = static_cast<std::size_t>(
                std::upper_bound(lineEnds.begin(), lineEnds.end(), written) - lineEnds.begin());
            mTornTail = complete < lineEnds.size() && written > (complete ? lineEnds[complete - 1] : 0);
            return failed(batch.size() - complete, error);
        }
        if (sync)
            ::fsync(mFd);
        return true;
    }

    bool failed(std::size_t lostEvents, int error)
    {
        mLost.fetch_add(lostEvents, std::memory_order_relaxed);
        std::lock_guard<std::mutex> lock(mMutex);
        mFailedUnreported += lostEvents;
        mWriteError = std::strerror(error);
        if (mOptions.warn_on_stderr && !mWarned)
        {
            mWarned = true;
            std::fprintf(stderr, "trt-otel: warning: cannot write journal %s: %s; events are lost (counted)\n",
                mOptions.journal.c_str(), mWriteError.c_str());
        }
        return false;
    }

    bool writeAll(char const* data, std::size_t size, std::size_t* written = nullptr)
    {
        std::size_t done = 0;
        while (done < size)
        {
            ssize_t const n = ::write(mFd, data + done, size - done);
            if (n < 0)
            {
                if (errno == EINTR)
                    continue;
                if (written != nullptr)
                    *written = done;
                return false;
            }
            done += static_cast<std::size_t>(n);
        }
        if (written != nullptr)
            *written = done;
        return true;
    }

    void format(std::string& out, detail::Record const& record) const
    {
        static constexpr char const* kTypes[]
            = {"build_start", "phase_start", "step", "phase_finish", "cancel", "anomaly", "log", "build_end"};
        // The layout of the Python writer's lines: compact, "type" first.
        out += "{\"type\":\"";
        out += kTypes[static_cast<std::size_t>(record.type)];
        out += "\",\"seq\":";
        detail::appendInt(out, record.seq);
        out += ",\"wall_ns\":";
        detail::appendInt(out, record.wall_ns);
        out += ",\"mono_ns\":";
        detail::appendInt(out, record.mono_ns);
        out += ",\"thread\":";
        detail::appendJsonString(out, mWriterThreads[static_cast<std::size_t>(record.thread)]);
        detail::Extra const empty{};
        detail::Extra const& extra = record.extra ? *record.extra : empty;
        switch (record.type)
        {
        case detail::Type::kBUILD_START:
            out += ",\"build_id\":";
            detail::appendJsonString(out, mOptions.build_id);
            out += ",\"attributes\":{";
            {
                std::map<std::string, std::string> attributes = mOptions.attributes;
                if (!mOptions.model_path.empty())
                    attributes.emplace("model.path", mOptions.model_path);
                if (!mRuntime.version.empty())
                {
                    attributes.emplace("trt.backend", mRuntime.backend);
                    attributes.emplace("trt.version", mRuntime.version);
                    attributes.emplace("trt.library", mRuntime.library);
                }
                attributes.emplace("trt.header_version", headerVersion());
                bool first = true;
                for (auto const& [key, value] : attributes)
                {
                    out += first ? "" : ",";
                    first = false;
                    detail::appendJsonString(out, key);
                    out += ':';
                    detail::appendJsonString(out, value);
                }
            }
            out += '}';
            break;
        case detail::Type::kPHASE_START:
            out += ",\"name\":";
            detail::appendJsonString(out, mWriterNames[static_cast<std::size_t>(record.name)]);
            out += ",\"parent\":";
            if (record.parent < 0)
                out += "null";
            else
                detail::appendJsonString(out, mWriterNames[static_cast<std::size_t>(record.parent)]);
            out += ",\"num_steps\":";
            detail::appendInt(out, record.number);
            break;
        case detail::Type::kSTEP:
            out += ",\"name\":";
            detail::appendJsonString(out, mWriterNames[static_cast<std::size_t>(record.name)]);
            out += ",\"step\":";
            detail::appendInt(out, record.number);
            break;
        case detail::Type::kPHASE_FINISH:
            out += ",\"name\":";
            detail::appendJsonString(out, mWriterNames[static_cast<std::size_t>(record.name)]);
            break;
        case detail::Type::kCANCEL:
            out += ",\"reason\":";
            detail::appendJsonString(out, extra.a);
            out += ",\"source\":";
            detail::appendJsonString(out, extra.b);
            out += record.flag ? ",\"timeout\":true" : ",\"timeout\":false";
            out += ",\"policy\":";
            detail::appendJsonString(out, extra.c);
            break;
        case detail::Type::kANOMALY:
            out += ",\"kind\":";
            detail::appendJsonString(out, extra.b);
            out += ",\"detail\":";
            detail::appendJsonString(out, extra.a);
            out += ",\"phase\":";
            if (record.name < 0)
                out += "null";
            else
                detail::appendJsonString(out, mWriterNames[static_cast<std::size_t>(record.name)]);
            break;
        case detail::Type::kLOG:
            out += ",\"severity\":";
            detail::appendJsonString(out, extra.b);
            out += ",\"message\":";
            detail::appendJsonString(out, extra.a);
            break;
        case detail::Type::kBUILD_END:
            out += ",\"outcome\":\"";
            out += toString(static_cast<Outcome>(record.flag));
            out += "\",\"detail\":";
            detail::appendJsonString(out, extra.a);
            out += ",\"error_type\":";
            if (record.number != 0)
                detail::appendJsonString(out, extra.b);
            else
                out += "null";
            break;
        }
        out += "}\n";
    }

    Options mOptions;
    Runtime const mRuntime{loadedRuntime()};
    std::uint64_t const mUid;
    std::int64_t const mMonoAnchor{detail::monoNs()};
    std::int64_t const mWallAnchor{detail::wallNs()};
    int mFd{-1};
    std::atomic<bool> mCancelled{false};
    std::atomic<std::uint64_t> mLost{0};
    std::atomic<std::uint64_t> mInternalErrors{0};

    mutable std::mutex mMutex;
    // Everything below is guarded by mMutex, except the writer's own copies.
    std::condition_variable mWakeCv;
    std::condition_variable mWrittenCv;
    std::int64_t mNextSeq{0};
    std::vector<detail::Record> mPending;
    detail::Record mScratch{};
    bool mStarted{false};
    bool mEnded{false};
    bool mStop{false};
    bool mWake{false};
    Outcome mOutcome{Outcome::kFAILURE};
    std::int64_t mStartMono{0};
    std::int64_t mWrittenThrough{-1};
    bool mCancelTimeout{false};
    std::string mCancelReason;
    std::deque<std::string> mNameText;
    std::unordered_map<std::string_view, std::int32_t> mNameIndex;
    std::unordered_map<std::thread::id, std::int32_t> mThreadIndex;
    std::vector<std::string> mThreadText;
    std::uint64_t mDroppedUnreported{0};
    std::uint64_t mFailedUnreported{0};
    std::string mWriteError;
    bool mWarned{false};

    // The writer thread's own.
    std::vector<std::string> mWriterNames;
    std::vector<std::string> mWriterThreads;
    bool mTornTail{false};

    std::thread mWriter; // last: started once everything above exists
};

//! A TensorRT logger that records the builder's messages in the monitor's journal (as log
//! events, which the build's span shows when they are errors or warnings) and passes them on.
class Logger : public nvinfer1::ILogger
{
public:
    explicit Logger(ProgressMonitor& monitor, nvinfer1::ILogger* next = nullptr,
        Severity least = Severity::kWARNING) noexcept
        : mMonitor(monitor)
        , mNext(next)
        , mLeast(least)
    {
    }

    void log(Severity severity, nvinfer1::AsciiChar const* message) noexcept override
    {
        if (severity <= mLeast && message != nullptr)
        {
            static constexpr char const* kNames[] = {"internal_error", "error", "warning", "info", "verbose"};
            auto const index = static_cast<std::size_t>(severity);
            mMonitor.log(index < 5 ? kNames[index] : "verbose", message);
        }
        if (mNext != nullptr)
            mNext->log(severity, message);
    }

private:
    ProgressMonitor& mMonitor;
    nvinfer1::ILogger* mNext;
    Severity mLeast;
};

} // namespace trt_otel
