#include "stores/file/layout.hpp"

#include <array>
#include <charconv>
#include <cstdio>
#include <vector>

namespace dlock::internal::file_store {
namespace {

constexpr std::size_t kNumberWidth = 20;  // digits of UINT64_MAX
// Keeps "q." + escaped name well below NAME_MAX (255) for every file system.
constexpr std::size_t kMaxPlainDirName = 200;

bool IsNameChar(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

bool AllNameChars(std::string_view s) noexcept {
  for (char c : s) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

template <typename T>
std::optional<T> ParseNumber(std::string_view text) {
  if (text.size() != kNumberWidth) return std::nullopt;
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.front() == '-') return std::nullopt;
  return value;
}

std::string Padded(std::uint64_t value) {
  char buf[kNumberWidth + 1];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(value));
  return buf;
}

}  // namespace

std::string QueueDirName(std::string_view queue) {
  std::string escaped;
  escaped.reserve(queue.size() + 8);
  for (char c : queue) {
    if (c == '/') {
      escaped += "%2F";
    } else if (c == '%') {  // lock names have none; escape anyway so the map stays one-to-one
      escaped += "%25";
    } else {
      escaped += c;
    }
  }
  if (escaped.size() + 2 <= kMaxPlainDirName) return "q." + escaped;
  // A readable prefix for people, the hash for uniqueness.
  return "h." + Sha256Hex(queue) + "." + escaped.substr(0, 64);
}

std::string FormatEntryName(const EntryName& name) {
  return Padded(static_cast<std::uint64_t>(name.sequence)) + "." + Padded(name.token) + "." + name.kind + "." +
         name.attempt_id + "." + name.nonce;
}

std::optional<EntryName> ParseEntryName(std::string_view text) {
  std::array<std::string_view, 5> fields;
  std::size_t start = 0;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    std::size_t dot = text.find('.', start);
    bool last = i + 1 == fields.size();
    if (last != (dot == std::string_view::npos)) return std::nullopt;
    fields[i] = text.substr(start, last ? std::string_view::npos : dot - start);
    start = dot + 1;
  }
  auto sequence = ParseNumber<std::int64_t>(fields[0]);
  auto token = ParseNumber<std::uint64_t>(fields[1]);
  if (!sequence || !token || !IsValidKind(fields[2]) || !IsValidAttemptId(fields[3]) || !IsNonce(fields[4])) {
    return std::nullopt;
  }
  return EntryName{*sequence, *token, std::string(fields[2]), std::string(fields[3]), std::string(fields[4])};
}

bool IsValidKind(std::string_view kind) noexcept { return !kind.empty() && kind.size() <= 64 && AllNameChars(kind); }

bool IsValidAttemptId(std::string_view attempt_id) noexcept {
  return attempt_id.size() <= 64 && AllNameChars(attempt_id);
}

bool IsNonce(std::string_view text) noexcept {
  if (text.size() != kNonceLength) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// FIPS 180-4 SHA-256; only used to name directories of very long queue names.
std::string Sha256Hex(std::string_view data) {
  static constexpr std::array<std::uint32_t, 64> k = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  std::array<std::uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::vector<unsigned char> msg(data.begin(), data.end());
  std::uint64_t bit_length = static_cast<std::uint64_t>(data.size()) * 8;
  msg.push_back(0x80);
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<unsigned char>(bit_length >> (i * 8)));
  auto rotr = [](std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  for (std::size_t block = 0; block < msg.size(); block += 64) {
    std::array<std::uint32_t, 64> w{};
    for (std::size_t i = 0; i < 16; ++i) {
      const unsigned char* p = &msg[block + i * 4];
      w[i] = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
    }
    for (std::size_t i = 16; i < 64; ++i) {
      std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::array<std::uint32_t, 8> v = h;
    for (std::size_t i = 0; i < 64; ++i) {
      std::uint32_t s1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
      std::uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
      std::uint32_t t1 = v[7] + s1 + ch + k[i] + w[i];
      std::uint32_t s0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
      std::uint32_t maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
      std::uint32_t t2 = s0 + maj;
      v = {t1 + t2, v[0], v[1], v[2], v[3] + t1, v[4], v[5], v[6]};
    }
    for (std::size_t i = 0; i < 8; ++i) h[i] += v[i];
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::uint32_t word : h) {
    for (int shift = 28; shift >= 0; shift -= 4) out += kHex[(word >> shift) & 0xf];
  }
  return out;
}

}  // namespace dlock::internal::file_store
