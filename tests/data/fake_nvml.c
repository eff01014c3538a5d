/* A stand-in for NVIDIA's NVML (libnvidia-ml.so.1) describing a made-up host, so that the
 * topology's NVML reading (src/topo/nvml.rs) is tested where no GPU is: built by the unit test
 * in src/topo/discover.rs with `cc -shared`, which states the same host as its expectation.
 *
 *   GPU 0 0000:1a:00.0 -- links 0,1,2 --> GPU 1 0000:1b:00.0 (link 3 down)
 *   GPU 2 0000:3c:00.0 -- links 0..3 --> NVSwitch 0000:05:00.0; link 4 up but not P2P capable
 *   GPU 3 0000:3d:00.0 -- links 0..3 --> NVSwitch 0000:05:00.0
 *   P2P read OK: 0<->1, 2<->3, and 0->2 only (one way, to check the direction is kept).
 *
 * Bus ids come back the way NVML writes them (upper case, legacy 16-byte field); handles are
 * looked up by bus id in any case. Every query before nvmlInit or after the last nvmlShutdown
 * answers NVML_ERROR_UNINITIALIZED, and fake_nvml_inits() tells the test how many inits are
 * still open; fake_nvml_hang(ms) makes nvmlInit_v2 take that long, as a wedged driver would. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef struct {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved[4];
} pci_info;

#define NGPU 4
static const char *bus_ids[NGPU] = {"0000:1a:00.0", "0000:1b:00.0", "0000:3c:00.0", "0000:3d:00.0"};
static int inits = 0;
/* A handle is the address of its GPU's index. */
static int index_of[NGPU] = {0, 1, 2, 3};

static int dev(void *h) {
    for (int i = 0; i < NGPU; i++)
        if (h == &index_of[i]) return i;
    return -1;
}

/* A wedged driver: nvmlInit_v2 takes this long first (fake_nvml_hang sets it). */
static unsigned hang_ms = 0;
void fake_nvml_hang(unsigned ms) { hang_ms = ms; }

int nvmlInit_v2(void) { if (hang_ms) usleep(hang_ms * 1000); inits++; return 0; }
int nvmlShutdown(void) { if (inits == 0) return 1; inits--; return 0; }
int fake_nvml_inits(void) { return inits; }

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **out) {
    if (!inits) return 1;
    for (int i = 0; i < NGPU; i++)
        if (strcasecmp(bus, bus_ids[i]) == 0) { *out = &index_of[i]; return 0; }
    return 6; /* NVML_ERROR_NOT_FOUND */
}

/* Where link `l` of GPU `d` goes: 0..3 a GPU, 4 the NVSwitch, -1 down. */
static int end_of(int d, unsigned l) {
    if (d == 0 && l < 3) return 1;
    if (d == 1 && l < 3) return 0;
    if ((d == 2 || d == 3) && l < 4) return 4;
    if (d == 2 && l == 4) return 4;
    return -1;
}

int nvmlDeviceGetNvLinkState(void *h, unsigned l, unsigned *active) {
    int d = dev(h);
    if (!inits) return 1;
    if (d < 0) return 2;
    if (l >= 12) return 2; /* this made-up GPU has 12 links */
    *active = end_of(d, l) >= 0;
    return 0;
}

int nvmlDeviceGetNvLinkCapability(void *h, unsigned l, unsigned cap, unsigned *result) {
    int d = dev(h);
    if (!inits) return 1;
    if (d < 0 || l >= 12) return 2;
    *result = cap == 0 && !(d == 2 && l == 4);
    return 0;
}

int nvmlDeviceGetNvLinkRemotePciInfo(void *h, unsigned l, pci_info *pci) {
    int d = dev(h), e;
    if (!inits) return 1;
    if (d < 0 || l >= 12 || (e = end_of(d, l)) < 0) return 2;
    memset(pci, 0, sizeof *pci);
    const char *id = e == 4 ? "0000:05:00.0" : bus_ids[e];
    for (int i = 0; id[i]; i++)
        pci->busId[i] = (id[i] >= 'a' && id[i] <= 'f') ? id[i] - 'a' + 'A' : id[i];
    pci->bus = e == 4 ? 0x05 : (e < 2 ? 0x1a + e : 0x3c + e - 2);
    return 0;
}

int nvmlDeviceGetP2PStatus(void *a, void *b, unsigned index, unsigned *status) {
    int i = dev(a), j = dev(b);
    if (!inits) return 1;
    if (i < 0 || j < 0 || index != 0) return 2;
    int ok = (i == 0 && j == 1) || (i == 1 && j == 0) || (i == 2 && j == 3) || (i == 3 && j == 2) ||
             (i == 0 && j == 2);
    *status = ok ? 0 : 1; /* NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED */
    return 0;
}
